"""Self-service API keys (`/api/v1/api-keys`): a user lists, makes (signed in, never with another
key) and revokes their own keys; the secret is in the first answer only, never stored (not even
for replays); someone else's key is a 404; at most API_KEYS_MAX_ACTIVE_PER_USER usable keys (also
under concurrency) and API_KEYS_MAX_CREATED_PER_DAY new ones a day."""

import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.keys import hash_key
from accounts.models import ApiKey, IdempotencyRecord
from accounts.services import AccountsError, create_api_key, create_own_api_key
from audit.models import AuditEvent
from tests.api.concurrency import run_concurrently
from tests.api.conftest import client_for
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def make(client: APIClient, body: dict[str, Any], key: str | None = None) -> Any:
    return client.post("/api/v1/api-keys", body, format="json", HTTP_IDEMPOTENCY_KEY=key or uuid.uuid4().hex)


def revoke(client: APIClient, key_id: int, body: Any = None) -> Any:
    return client.post(f"/api/v1/api-keys/{key_id}/revoke", body, format="json",
                       HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)


def signed_in(user: Any) -> APIClient:
    """A browser session's calls (the portal's), which may make keys."""
    client = APIClient()
    client.force_login(user)
    return client


def bearer(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def test_a_new_key_works_and_its_secret_is_shown_once_and_never_stored() -> None:
    user = UserFactory()
    client_for(user)
    client = signed_in(user)
    expires = (timezone.now() + timedelta(days=30)).replace(microsecond=0)
    response = make(client, {"name": "laptop", "expires_at": expires.isoformat()}, key="k-1")
    assert response.status_code == 201, response.json()
    assert response["Cache-Control"] == "no-store"
    made = response.json()
    raw = made["key"]
    assert raw.startswith("gpub_") and made["prefix"] and raw.startswith(f"gpub_{made['prefix']}_")
    assert (made["name"], made["state"], made["revoked_at"]) == ("laptop", "active", None)
    stored = ApiKey.objects.get(pk=made["id"])
    assert (stored.user_id, stored.key_hash, stored.expires_at) == (user.pk, hash_key(raw), expires)
    assert bearer(raw).get("/api/v1/api-keys").status_code == 200

    replay = make(client, {"name": "laptop", "expires_at": expires.isoformat()}, key="k-1")
    assert replay.status_code == 201 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == {**made, "key": None}
    assert ApiKey.objects.filter(user=user).count() == 2  # client_for's and this one: no second key
    record = IdempotencyRecord.objects.get(principal=f"user:{user.pk}", key="k-1")
    assert raw not in json.dumps(record.response_body) and record.response_body["key"] is None
    event = AuditEvent.objects.get(action="accounts.api_key.create", subject_id=str(made["id"]))
    assert (event.actor_id, event.data["user"], event.data["via"]) == (str(user.pk), user.pk, "api-session")
    assert raw not in json.dumps(event.data)


def test_the_list_is_the_callers_own_keys_newest_first_with_their_state() -> None:
    user, other = UserFactory(), UserFactory()
    client = client_for(user)
    client_for(other)
    expired = ApiKey.objects.create(user=user, name="old", prefix="gpub_old0001", key_hash="x",
                                    expires_at=timezone.now() - timedelta(days=1))
    gone = ApiKey.objects.create(user=user, name="gone", prefix="gpub_gone001", key_hash="y",
                                 revoked_at=timezone.now())
    listed = client.get("/api/v1/api-keys").json()
    assert listed["count"] == 3
    rows = [(row["name"], row["state"]) for row in listed["results"]]
    assert rows == [("gone", "revoked"), ("old", "expired"), ("test", "active")]
    assert {row["id"] for row in listed["results"]} >= {expired.pk, gone.pk}
    assert all("key" not in row and "key_hash" not in row for row in listed["results"])


def test_revoking_a_key_stops_it_at_once_and_is_audited() -> None:
    user = UserFactory()
    client = client_for(user)
    made = make(signed_in(user), {"name": "ci"}).json()
    response = revoke(client, made["id"])
    assert response.status_code == 200, response.json()
    assert response.json()["state"] == "revoked"
    assert bearer(made["key"]).get("/api/v1/api-keys").status_code == 401
    first = ApiKey.objects.get(pk=made["id"]).revoked_at
    assert revoke(client, made["id"]).json()["revoked_at"] == response.json()["revoked_at"]
    assert ApiKey.objects.get(pk=made["id"]).revoked_at == first
    assert AuditEvent.objects.filter(action="accounts.api_key.revoke", subject_id=str(made["id"]),
                                     actor_id=str(user.pk)).count() == 1


def test_a_key_can_revoke_itself() -> None:
    user = UserFactory()
    client = client_for(user)
    own = ApiKey.objects.get(user=user)
    assert revoke(client, own.pk).status_code == 200
    assert client.get("/api/v1/api-keys").status_code == 401


def test_someone_elses_key_is_not_found_and_stays_usable() -> None:
    owner, intruder = UserFactory(), UserFactory()
    theirs = make(signed_in(owner), {"name": "theirs"}).json()
    response = revoke(client_for(intruder), theirs["id"])
    assert response.status_code == 404 and response.json()["detail"] == "No such API key."
    assert ApiKey.objects.get(pk=theirs["id"]).revoked_at is None
    assert bearer(theirs["key"]).get("/api/v1/api-keys").status_code == 200


@pytest.mark.parametrize(("body", "field"), [
    ({}, "name"),
    ({"name": ""}, "name"),
    ({"name": "x" * 101}, "name"),
    ({"name": 7}, "name"),
    ({"name": "tab\there"}, "name"),
    ({"name": "ok", "expires_at": "2020-01-01T00:00:00Z"}, "expires_at"),
    ({"name": "ok", "expires_at": "2099-01-01T00:00:00"}, "expires_at"),  # no UTC offset
    ({"name": "ok", "expires_at": "soon"}, "expires_at"),
    ({"name": "ok", "scopes": ["all"]}, "scopes"),
])
def test_bad_input_is_a_400_naming_the_field_and_makes_nothing(body: dict[str, Any], field: str) -> None:
    user = UserFactory()
    client_for(user)
    response = make(signed_in(user), body)
    assert response.status_code == 400, response.json()
    assert field in response.json()["errors"], response.json()
    assert ApiKey.objects.filter(user=user).count() == 1


def test_revoke_takes_no_body_and_no_query() -> None:
    user = UserFactory()
    client = client_for(user)
    own = ApiKey.objects.get(user=user)
    assert revoke(client, own.pk, {"now": True}).status_code == 400
    response = client.post(f"/api/v1/api-keys/{own.pk}/revoke?force=1", HTTP_IDEMPOTENCY_KEY="q")
    assert response.status_code == 400
    missing = signed_in(user).post("/api/v1/api-keys", {"name": "x"}, format="json")
    assert (missing.status_code, missing.json()["type"]) == (400, "idempotency-key-missing")
    assert ApiKey.objects.get(user=user).revoked_at is None
    assert ApiKey.objects.filter(user=user).count() == 1


def test_at_most_the_limit_of_usable_keys(settings: Any) -> None:
    settings.API_KEYS_MAX_ACTIVE_PER_USER = 3
    user = UserFactory()
    client_for(user)  # 1 active
    client = signed_in(user)
    ApiKey.objects.create(user=user, name="expired", prefix="gpub_exp0001", key_hash="x",
                          expires_at=timezone.now() - timedelta(days=1))  # does not count
    assert make(client, {"name": "two"}).status_code == 201
    three = make(client, {"name": "three"}).json()
    refused = make(client, {"name": "four"})
    assert refused.status_code == 409
    assert refused.json()["type"] == "too-many-api-keys"
    assert "3 active API keys" in refused.json()["detail"]
    assert revoke(client, three["id"]).status_code == 200
    assert make(client, {"name": "four"}).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_cannot_pass_the_limit(settings: Any) -> None:
    settings.API_KEYS_MAX_ACTIVE_PER_USER = 4
    user = UserFactory()
    client_for(user)

    def attempt(index: int) -> Any:
        client = signed_in(user)

        def call() -> int:
            return make(client, {"name": f"k{index}"}).status_code
        return call

    codes = run_concurrently([attempt(index) for index in range(8)])
    assert sorted(codes) == [201] * 3 + [409] * 5
    assert ApiKey.objects.filter(user=user, revoked_at__isnull=True).count() == 4


def test_expiry_in_the_list_is_exact() -> None:
    user = UserFactory()
    client = client_for(user)
    soon = timezone.now() + timedelta(seconds=1)
    made = make(signed_in(user), {"name": "short", "expires_at": soon.isoformat()}).json()
    ApiKey.objects.filter(pk=made["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    rows = {row["id"]: row["state"] for row in client.get("/api/v1/api-keys").json()["results"]}
    assert rows[made["id"]] == "expired"
    assert bearer(made["key"]).get("/api/v1/api-keys").status_code == 401


def test_a_key_cannot_make_keys() -> None:
    """Review: a leaked, short-lived or just-revoked key minted a key that never expires and
    outlived its revocation."""
    user = UserFactory()
    short, raw = create_api_key(user=user, name="ci", expires_at=timezone.now() + timedelta(hours=1))
    refused = make(bearer(raw), {"name": "laptop"})
    assert refused.status_code == 403
    assert "An API key cannot make API keys" in refused.json()["detail"]
    assert list(ApiKey.objects.filter(user=user)) == [short]
    assert bearer(raw).get("/api/v1/api-keys").status_code == 200  # it may still list and revoke


def test_a_deactivated_user_makes_no_key() -> None:
    user = UserFactory()
    get_user_model().objects.filter(pk=user.pk).update(is_active=False)
    with pytest.raises(AccountsError, match="not active"):
        create_own_api_key(user=user, name="late")
    assert not ApiKey.objects.filter(user=user).exists()


def test_at_most_so_many_new_keys_a_day_revoked_ones_too(settings: Any) -> None:
    settings.API_KEYS_MAX_ACTIVE_PER_USER = 1
    settings.API_KEYS_MAX_CREATED_PER_DAY = 3
    user = UserFactory()
    client = signed_in(user)
    for n in range(3):
        made = make(client, {"name": f"churn-{n}"})
        assert made.status_code == 201, made.json()
        revoke(client, made.json()["id"])
    refused = make(client, {"name": "one more"})
    assert (refused.status_code, refused.json()["type"]) == (409, "too-many-new-api-keys")
    assert refused.json()["detail"].startswith("You made 3 API keys in the last 24 hours")
    ApiKey.objects.filter(user=user).update(created_at=timezone.now() - timedelta(days=1, minutes=1))
    assert make(client, {"name": "next day"}).status_code == 201


def test_the_daily_limit_counts_only_the_keys_the_user_made(settings: Any) -> None:
    """Review: an admin's keys for the user (admin site, `manage.py create_api_key`) were counted
    toward the user's own daily limit (the rows did not say who made them); now `created_by` does."""
    settings.API_KEYS_MAX_ACTIVE_PER_USER = 20
    settings.API_KEYS_MAX_CREATED_PER_DAY = 2
    user, admin = UserFactory(), UserFactory(is_staff=True)
    by_admin = [create_api_key(user=user, name=f"ops-{n}", actor=admin)[0] for n in range(2)]
    by_system = create_api_key(user=user, name="cli")[0]
    assert [key.created_by for key in (*by_admin, by_system)] == [admin, admin, None]
    client = signed_in(user)
    for n in range(2):
        made = make(client, {"name": f"mine-{n}"})
        assert made.status_code == 201, made.json()
        assert ApiKey.objects.get(pk=made.json()["id"]).created_by == user
    refused = make(client, {"name": "one more"})
    assert (refused.status_code, refused.json()["type"]) == (409, "too-many-new-api-keys")
    assert refused.json()["detail"].startswith("You made 2 API keys in the last 24 hours")
    assert ApiKey.objects.filter(user=user).count() == 5  # the refusal made nothing
    create_api_key(user=user, name="ops-more", actor=admin)  # an admin is not limited by it


def test_keys_made_before_created_by_still_count_toward_the_daily_limit(settings: Any) -> None:
    """Review: migration accounts/0005 left `created_by` null on existing keys, so a user's keys
    made just before the deploy stopped counting; 0006 fills it from their audit events."""
    import importlib

    from django.apps import apps

    settings.API_KEYS_MAX_CREATED_PER_DAY = 2
    user = UserFactory()
    client = signed_in(user)
    for n in range(2):
        assert make(client, {"name": f"before-{n}"}).status_code == 201
    admin = UserFactory(is_staff=True)
    create_api_key(user=user, name="by an admin", actor=admin)
    ApiKey.objects.filter(user=user).update(created_by=None)  # the rows as 0005 left them
    importlib.import_module("accounts.migrations.0006_api_key_created_by_from_audit").forwards(apps, None)
    assert dict(ApiKey.objects.filter(user=user).values_list("name", "created_by")) == {
        "before-0": user.pk, "before-1": user.pk, "by an admin": admin.pk}
    assert make(client, {"name": "after the deploy"}).status_code == 409
