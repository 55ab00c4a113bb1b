"""Authentication (API keys, sessions), problem details for 401, and rate limits (429)."""

import io
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.test import RequestFactory
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import ApiKey, IdempotencyRecord
from accounts.services import create_api_key, reap_idempotency_records, revoke_api_key
from accounts.tasks import reap_idempotency_keys
from config.api.middleware import is_bearer_api_call
from config.api.ratelimit import inflight_slot
from config.clock import db_now
from tests.api.factories import Tenant
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def test_no_credentials_is_401_problem(db: Any) -> None:
    response = APIClient().get("/api/v1/jobs")
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["type"] == "unauthenticated"
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("header", ["Bearer nonsense", "Bearer gpub_abc_def", "Bearer "])
def test_bad_keys_are_401(db: Any, header: str) -> None:
    response = APIClient().get("/api/v1/jobs", HTTP_AUTHORIZATION=header)
    assert response.status_code == 401 and response.json()["type"] == "unauthenticated"


def test_revoked_and_expired_keys_are_refused(tenant: Tenant) -> None:
    key, raw = create_api_key(user=tenant.user, name="ci")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert client.get("/api/v1/jobs").status_code == 200
    assert ApiKey.objects.get(pk=key.pk).key_hash != raw  # only the hash is stored
    revoke_api_key(api_key=key)
    assert client.get("/api/v1/jobs").status_code == 401
    expiring, raw2 = create_api_key(user=tenant.user, name="old",
                                    expires_at=timezone.now() + timedelta(seconds=30))
    ApiKey.objects.filter(pk=expiring.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw2}")
    assert client.get("/api/v1/jobs").status_code == 401


def test_session_auth_works_for_browser(tenant: Tenant) -> None:
    client = APIClient()
    client.force_login(tenant.user)
    assert client.get("/api/v1/jobs").status_code == 200


def test_create_api_key_command_prints_a_working_key(tenant: Tenant) -> None:
    out = io.StringIO()
    call_command("create_api_key", tenant.user.username, "--name", "laptop", stdout=out)
    raw = out.getvalue().strip()
    assert ApiKey.objects.get(user=tenant.user, name="laptop").prefix in raw
    assert APIClient().get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 200


def test_admin_creates_key_once_and_revokes(tenant: Tenant) -> None:
    staff = UserFactory(is_staff=True, is_superuser=True)
    client = APIClient()
    client.force_login(staff)
    response = client.post("/admin/accounts/apikey/add/", {"user": tenant.user.pk, "name": "admin-made"},
                           follow=True)
    assert response.status_code == 200
    key = ApiKey.objects.get(name="admin-made")
    assert f"gpub_{key.prefix}_" in response.content.decode()
    client.post("/admin/accounts/apikey/", {"action": "revoke_keys", "_selected_action": [key.pk]})
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    for model in ("region", "organization", "project", "orgmembership", "membership"):
        assert client.get(f"/admin/accounts/{model}/").status_code == 200


def test_per_key_rate_limit_is_429_with_retry_after(api: APIClient, settings: Any) -> None:
    settings.API_RATE_LIMITS = {"default": {"key": "3/minute"}}
    assert [api.get("/api/v1/jobs").status_code for _ in range(3)] == [200, 200, 200]
    response = api.get("/api/v1/jobs")
    assert response.status_code == 429
    assert response.json()["type"] == "rate-limited"
    assert 1 <= int(response["Retry-After"]) <= 60


def test_per_org_rate_limit_spans_keys(tenant: Tenant, job_body: Any, settings: Any) -> None:
    from tests.api.conftest import client_for
    from tests.api.factories import add_member

    settings.API_RATE_LIMITS = {"default": {"key": "100/minute"}, "jobs-submit": {"org": "2/minute"}}
    clients = [client_for(tenant.user), client_for(add_member(tenant.project))]
    codes = [
        c.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex).status_code
        for c in clients * 2
    ]
    assert codes == [201, 201, 429, 429]


def test_inflight_submission_cap(tenant: Tenant, api: APIClient, job_body: Any) -> None:
    tenant.org.max_inflight_submissions = 1
    tenant.org.save()
    with inflight_slot(org_id=tenant.org.pk, cap=1):  # another submission is in flight
        response = api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 429 and response.json()["scope"] == "inflight-submissions"
    assert api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="k").status_code == 201


def test_expired_idempotency_records_are_reaped(api: APIClient, job_body: Any) -> None:
    api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="old")
    api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="new")
    record = IdempotencyRecord.objects.get(key="old")
    assert record.expires_at - record.created_at >= timedelta(hours=24)
    # The reaper compares with the transaction's now() (db_now), which in a test is when the test's
    # transaction began: expire the record on that clock, not the wall clock, which has moved on.
    IdempotencyRecord.objects.filter(key="old").update(expires_at=db_now() - timedelta(seconds=1))
    assert reap_idempotency_records() == 1
    assert reap_idempotency_keys() == 0
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["new"]


def test_bearer_api_calls_skip_browser_middleware(tenant: Tenant, api: APIClient) -> None:
    response = api.get("/api/v1/jobs")
    assert response.status_code == 200
    browser = APIClient()
    browser.force_login(tenant.user)
    response = browser.get("/api/v1/jobs")
    assert response.status_code == 200 and hasattr(response.wsgi_request, "session")


def test_bearer_api_calls_skip_the_session_under_asgi_too(tenant: Tenant, monkeypatch: Any) -> None:
    """Review: the skip applied only to the sync chain; under uvicorn (ASGI, `async_mode`) a Bearer
    call still loaded the session its client sent. A browser's session call still loads it."""
    from asgiref.sync import async_to_sync
    from django.contrib.sessions.middleware import SessionMiddleware
    from django.test import AsyncClient

    loaded: list[str] = []
    real = SessionMiddleware.process_request

    def spy(self: SessionMiddleware, request: Any) -> None:
        loaded.append(request.path_info)
        real(self, request)

    monkeypatch.setattr(SessionMiddleware, "process_request", spy)
    _key, raw = create_api_key(user=tenant.user, name="asgi")

    async def calls() -> tuple[int, int]:  # one event loop: the DB work stays on this thread
        client = AsyncClient()
        await client.aforce_login(tenant.admin)
        bearer = await client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {raw}"})
        assert loaded == []
        return bearer.status_code, (await client.get("/api/v1/jobs")).status_code

    assert async_to_sync(calls)() == (200, 200)
    assert loaded == ["/api/v1/jobs"]


def test_session_api_post_still_needs_csrf(tenant: Tenant, job_body: Any) -> None:
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(tenant.user)
    response = browser.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="c")
    assert response.status_code == 403


def test_submission_key_limit_charges_refused_requests_and_not_the_org(
    tenant: Tenant, api: APIClient, job_body: Any, settings: Any
) -> None:
    settings.API_RATE_LIMITS = {"default": {"key": "2/minute", "org": "2/minute"}}
    bad = api.post("/api/v1/jobs", {"name": "x"}, format="json", HTTP_IDEMPOTENCY_KEY="bad")
    assert bad.status_code == 400  # refused before the gate: still charged to the key
    assert api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="a").status_code == 201
    response = api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="b")
    assert response.status_code == 429 and "per user" in response.json()["detail"]
    from tests.api.conftest import client_for
    # Another key of the same user shares the user's limit (review: each key had its own, so a
    # user who made more keys got that many times the limit).
    same_user = client_for(tenant.user)
    response = same_user.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="s")
    assert response.status_code == 429 and "per user" in response.json()["detail"]
    # The user's refusals charged no org slot: another user of the org still gets the last one.
    other = client_for(tenant.admin)
    assert other.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="c").status_code == 201
    response = other.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY="d")
    assert response.status_code == 429 and "per org" in response.json()["detail"]


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "bEaReR"])
def test_the_bearer_scheme_is_case_insensitive(tenant: Tenant, scheme: str) -> None:
    """QA: `bearer <key>` was 401 "credentials were not provided" (RFC 7235: the scheme is
    case-insensitive). It also skips the browser middleware, as `Bearer` does."""
    _key, raw = create_api_key(user=tenant.user, name="ci")
    response = APIClient().get("/api/v1/jobs", HTTP_AUTHORIZATION=f"{scheme} {raw}")
    assert response.status_code == 200, response.json()
    assert is_bearer_api_call(RequestFactory().get("/api/v1/jobs", HTTP_AUTHORIZATION=f"{scheme} {raw}"))
    wrong = APIClient().get("/api/v1/jobs", HTTP_AUTHORIZATION=f"{scheme} gpub_abc_def")
    assert (wrong.status_code, wrong.json()["detail"]) == (401, "Invalid API key.")
