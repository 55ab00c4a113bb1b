"""The API keys page (/api-keys/): a signed-in user makes a key (its secret shown on that answer
only, never stored), sees their own keys only, revokes one (someone else's is a 404)."""

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.keys import hash_key
from accounts.models import ApiKey
from audit.models import AuditEvent
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def signed_in(user: Any) -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    return client


def post(client: Client, path: str, data: dict[str, str]) -> Any:
    """`data` posted from the page as just shown (its CSRF cookie and the form's key)."""
    page = client.get("/api-keys/")  # sets the CSRF cookie, as a browser's first visit does
    return client.post(path, {"key": page.context["form"]["key"].value(), **data,
                              "csrfmiddlewaretoken": client.cookies["csrftoken"].value})


def secret_in(html: str) -> str:
    found = re.search(r'<code id="new-key">([^<]+)</code>', html)
    assert found, html
    return found.group(1)


def test_sign_in_is_required() -> None:
    response = Client().get("/api-keys/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_make_a_key_see_it_once_and_use_it() -> None:
    user = UserFactory()
    client = signed_in(user)
    made = post(client, "/api-keys/", {"name": "laptop", "lifetime": "30"})
    key = ApiKey.objects.get(user=user)
    # 303 to the page naming the key (a reload makes no second key)
    assert (made.status_code, made["Location"]) == (303, f"/api-keys/?made={key.pk}")
    cookie = made.cookies[f"gpubank_new_api_key_{key.pk}"]
    assert (cookie["path"], cookie["httponly"], cookie["samesite"]) == ("/api-keys/", True, "Strict")
    response = client.get(made["Location"])
    assert response["Cache-Control"] == "no-store"
    raw = secret_in(response.content.decode())
    assert 'id="new-key-name">laptop<' in response.content.decode()
    assert response.cookies[f"gpubank_new_api_key_{key.pk}"].value == ""  # deleted: shown once
    assert (key.name, key.key_hash) == ("laptop", hash_key(raw))
    assert abs((key.expires_at - key.created_at) - timedelta(days=30)) < timedelta(minutes=1)
    assert AuditEvent.objects.filter(action="accounts.api_key.create", subject_id=str(key.pk),
                                     actor_id=str(user.pk)).exists()
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/api-keys").json()["results"][0]["name"] == "laptop"

    again = client.get(made["Location"]).content.decode()  # a reload
    assert raw not in again and 'id="new-key"' not in again
    assert f"gpub_{key.prefix}_" in again and "laptop" in again


def test_a_key_that_never_expires() -> None:
    user = UserFactory()
    assert post(signed_in(user), "/api-keys/", {"name": "ci", "lifetime": ""}).status_code == 303
    assert ApiKey.objects.get(user=user).expires_at is None


@pytest.mark.parametrize(("data", "message"), [
    ({"name": "", "lifetime": "30"}, "This field is required."),
    ({"name": "x" * 101, "lifetime": "30"}, "at most 100 characters"),
    ({"name": "bell\x07", "lifetime": "30"}, "Control characters are not allowed."),
    ({"name": "ok", "lifetime": "7"}, "Select a valid choice."),
])
def test_bad_input_is_shown_on_the_form_and_makes_nothing(data: dict[str, str], message: str) -> None:
    user = UserFactory()
    response = post(signed_in(user), "/api-keys/", data)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not ApiKey.objects.filter(user=user).exists()


def test_the_limit_is_shown_on_the_form(settings: Any) -> None:
    settings.API_KEYS_MAX_ACTIVE_PER_USER = 1
    user = UserFactory()
    client = signed_in(user)
    assert post(client, "/api-keys/", {"name": "one", "lifetime": "30"}).status_code == 303
    refused = post(client, "/api-keys/", {"name": "two", "lifetime": "30"})
    assert refused.status_code == 409
    assert "the most allowed is 1" in refused.content.decode()
    assert ApiKey.objects.filter(user=user).count() == 1


def test_only_own_keys_are_listed_and_revocable() -> None:
    owner, other = UserFactory(), UserFactory()
    post(signed_in(other), "/api-keys/", {"name": "others-key", "lifetime": "30"})
    theirs = ApiKey.objects.get(user=other)
    client = signed_in(owner)
    post(client, "/api-keys/", {"name": "mine", "lifetime": "30"})
    mine = ApiKey.objects.get(user=owner)
    page = client.get("/api-keys/").content.decode()
    assert "mine" in page and "others-key" not in page and theirs.prefix not in page

    assert post(client, f"/api-keys/{theirs.pk}/revoke", {}).status_code == 404
    assert ApiKey.objects.get(pk=theirs.pk).revoked_at is None
    response = post(client, f"/api-keys/{mine.pk}/revoke", {})
    assert (response.status_code, response["Location"]) == (302, "/api-keys/")
    assert ApiKey.objects.get(pk=mine.pk).revoked_at is not None
    assert "Revoked" in client.get("/api-keys/").content.decode()


def test_revoke_needs_a_post_with_the_csrf_token() -> None:
    user = UserFactory()
    client = signed_in(user)
    post(client, "/api-keys/", {"name": "mine", "lifetime": "30"})
    key = ApiKey.objects.get(user=user)
    assert client.get(f"/api-keys/{key.pk}/revoke").status_code == 405
    assert client.post(f"/api-keys/{key.pk}/revoke").status_code == 403  # no token
    assert ApiKey.objects.get(pk=key.pk).revoked_at is None


def test_the_secret_is_shown_only_to_the_user_who_made_it() -> None:
    """A cookie left in a shared browser does not show one user's new key to the next user."""
    maker, next_user = UserFactory(), UserFactory()
    client = signed_in(maker)
    made = post(client, "/api-keys/", {"name": "laptop", "lifetime": "30"})
    client.force_login(next_user)
    page = client.get(made["Location"]).content.decode()  # the cookie is still in the browser
    assert 'id="new-key"' not in page


def test_a_forged_cookie_shows_nothing() -> None:
    user = UserFactory()
    client = signed_in(user)
    post(client, "/api-keys/", {"name": "real", "lifetime": "30"})
    key = ApiKey.objects.get(user=user)
    client.cookies[f"gpubank_new_api_key_{key.pk}"] = f"{user.pk}:{key.pk}:gpub_forged_secret"
    assert 'id="new-key"' not in client.get(f"/api-keys/?made={key.pk}").content.decode()


def test_keys_made_in_two_tabs_each_show_their_own_secret() -> None:
    """QA: with one cookie for every new key, the second tab's key was shown in both tabs (under
    the first one's name) and the first key's secret never."""
    user = UserFactory()
    client = signed_in(user)
    first = post(client, "/api-keys/", {"name": "tab-a", "lifetime": "30"})
    second = post(client, "/api-keys/", {"name": "tab-b", "lifetime": "30"})
    for made, name in ((first, "tab-a"), (second, "tab-b")):
        page = client.get(made["Location"]).content.decode()
        key = ApiKey.objects.get(user=user, name=name)
        assert hash_key(secret_in(page)) == key.key_hash
        assert f'id="new-key-name">{name}<' in page
    assert 'id="new-key"' not in client.get("/api-keys/?made=abc").content.decode()


def test_the_portal_writes_only_the_users_own_keys() -> None:
    """Decision 0014: of the services, the portal imports the API key ones and nothing else (review:
    a denylist of module names let `from ledger import services` through)."""
    import ast
    from pathlib import Path

    allowed = {"accounts.services": {"AccountsError", "TooManyKeys", "create_own_api_key", "key_state",
                                     "revoke_api_key"}}
    portal = Path(__file__).resolve().parents[2] / "portal"
    sources = sorted(portal.rglob("*.py"))
    assert len(sources) > 5
    imported: set[str] = set()  # every imported name, dotted: "accounts.services.revoke_api_key"
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    services = {name for name in imported if ".services" in name or name.endswith(".services")}
    assert "accounts.services.create_own_api_key" in services  # this test reads the real imports
    wanted = {f"{module}.{name}" for module, names in allowed.items() for name in names}
    assert services <= wanted, sorted(services - wanted)


def test_odd_made_values_and_a_key_revoked_before_the_redirect_show_nothing() -> None:
    """Review: `?made=²` was a 500 (a Unicode digit); a key revoked in another tab before the
    redirect was followed was still shown as the new key."""
    user = UserFactory()
    client = signed_in(user)
    for odd in ("²", "-1", "1" * 19, ""):
        response = client.get("/api-keys/", {"made": odd})
        assert response.status_code == 200 and 'id="new-key"' not in response.content.decode()
    made = post(client, "/api-keys/", {"name": "gone", "lifetime": "30"})
    key = ApiKey.objects.get(user=user)
    post(client, f"/api-keys/{key.pk}/revoke", {})
    page = client.get(made["Location"])
    assert 'id="new-key"' not in page.content.decode()
    assert page.cookies[f"gpubank_new_api_key_{key.pk}"].value == ""  # read once, shown or not


def test_the_same_form_sent_twice_makes_one_key() -> None:
    """QA: a double click on "Make key" (the same form, the same CSRF token) made two keys. The form's
    key, made when the page was shown, makes the second POST answer with the first key."""
    user = UserFactory()
    client = signed_in(user)
    page = client.get("/api-keys/")
    form = {"name": "laptop", "lifetime": "30", "key": page.context["form"]["key"].value(),
            "csrfmiddlewaretoken": client.cookies["csrftoken"].value}
    first = client.post("/api-keys/", form)
    second = client.post("/api-keys/", form)  # the browser kept the first answer's cookie
    key = ApiKey.objects.get(user=user)
    assert [r.status_code for r in (first, second)] == [303, 303]
    assert first["Location"] == second["Location"] == f"/api-keys/?made={key.pk}"
    assert f"gpubank_new_api_key_{key.pk}" not in second.cookies  # nothing new to show
    shown = client.get(second["Location"]).content.decode()
    assert hash_key(secret_in(shown)) == key.key_hash  # the first answer's cookie, shown once
    assert AuditEvent.objects.filter(action="accounts.api_key.create").count() == 1
    # The first answer lost (its cookie never kept): the key is named, its secret is not shown.
    client.cookies.pop(f"gpubank_new_api_key_{key.pk}", None)
    third = client.post("/api-keys/", form)
    assert third["Location"] == f"/api-keys/?made={key.pk}" and ApiKey.objects.count() == 1
    page = client.get(third["Location"]).content.decode()
    assert 'id="new-key"' not in page
    assert 'id="made-key-name">laptop<' in page and "revoke this key and make another" in page


def test_the_same_form_sent_back_edited_makes_no_second_key() -> None:
    user = UserFactory()
    client = signed_in(user)
    page = client.get("/api-keys/")
    form = {"name": "laptop", "lifetime": "30", "key": page.context["form"]["key"].value(),
            "csrfmiddlewaretoken": client.cookies["csrftoken"].value}
    client.post("/api-keys/", form)
    edited = client.post("/api-keys/", {**form, "name": "ci"})
    assert edited.status_code == 409
    assert "This form was sent already and made a key" in edited.content.decode()
    again = edited.context["form"]
    assert again["key"].value() != form["key"] and again["name"].value() == "ci"  # a new form
    assert list(ApiKey.objects.values_list("name", flat=True)) == ["laptop"]
    client.post("/api-keys/", {**form, "name": "ci", "key": again["key"].value()})
    assert sorted(ApiKey.objects.values_list("name", flat=True)) == ["ci", "laptop"]


@pytest.mark.parametrize("key", ["", "nope", "0123456789abcdef0123456789abcdef:1"])
def test_a_form_without_the_key_it_was_shown_with_makes_no_key(key) -> None:
    user = UserFactory()
    client = signed_in(user)
    response = post(client, "/api-keys/", {"name": "laptop", "lifetime": "30", "key": key})
    assert response.status_code == 400 and "This form is out of date" in response.content.decode()
    assert not ApiKey.objects.exists()


def test_a_revoked_keys_row_keeps_its_expiry_and_says_when_it_was_revoked() -> None:
    """QA: the Expires column of a revoked key read "revoked <date>" and its expiry was no longer
    shown. The state says when it was revoked; Expires stays the expiry."""
    from django.utils import timezone

    user = UserFactory()
    client = signed_in(user)
    post(client, "/api-keys/", {"name": "old", "lifetime": "30"})
    post(client, "/api-keys/", {"name": "forever", "lifetime": ""})
    old, forever = ApiKey.objects.get(name="old"), ApiKey.objects.get(name="forever")
    for key in (old, forever):
        post(client, f"/api-keys/{key.pk}/revoke", {})
        key.refresh_from_db()
    page = client.get("/api-keys/").content.decode()

    def cells(key: ApiKey) -> list[str]:
        row = re.search(rf'<tr data-key="{key.pk}">(.*?)</tr>', page, re.S)
        assert row, page
        found = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
        return [re.sub(r"\s+", " ", cell).strip() for cell in found]

    def when(value: Any) -> str:
        return f"{timezone.localtime(value):%Y-%m-%d %H:%M}"

    # key starts, state, made, expires, last used, (no revoke button)
    assert cells(old)[1:4] == [f"Revoked {when(old.revoked_at)}", when(old.created_at), when(old.expires_at)]
    assert cells(forever)[1:4] == [f"Revoked {when(forever.revoked_at)}", when(forever.created_at), "never"]


def test_a_form_sent_while_its_first_send_runs_keeps_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: the 409 of a form still being made gave the form a new key, so sending it again made
    a second key. It keeps the key it was shown with: sent again, it answers with the first's."""
    from config.api.errors import IdempotencyKeyInFlight
    from portal import keys

    user = UserFactory()
    client = signed_in(user)
    page = client.get("/api-keys/")
    form = {"name": "laptop", "lifetime": "30", "key": page.context["form"]["key"].value(),
            "csrfmiddlewaretoken": client.cookies["csrftoken"].value}
    first = client.post("/api-keys/", form)
    assert first.status_code == 303
    real = keys.run_once

    def still_running(**kwargs: Any) -> Any:  # the second send meets the first's uncommitted record
        raise IdempotencyKeyInFlight("still in flight", key=kwargs["key"])

    monkeypatch.setattr(keys, "run_once", still_running)
    waiting = client.post("/api-keys/", form)
    assert waiting.status_code == 409 and "still being sent" in waiting.content.decode()
    again = waiting.context["form"]
    assert again["key"].value() == form["key"] and again["name"].value() == "laptop"
    monkeypatch.setattr(keys, "run_once", real)
    resent = client.post("/api-keys/", {**form, "key": again["key"].value()})
    key = ApiKey.objects.get(user=user)  # one key
    assert resent.status_code == 303 and resent["Location"] == f"/api-keys/?made={key.pk}"
