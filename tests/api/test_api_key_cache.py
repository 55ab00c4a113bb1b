"""API-key authentication cache (per process, short TTL) and throttled `last_used_at`."""

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient, APIRequestFactory

from accounts.api import authentication
from accounts.models import ApiKey
from accounts.services import create_api_key, revoke_api_key
from tests.api.factories import Tenant
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


class Clock:
    """Stands in for `time.monotonic` inside the authentication module."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: Any) -> Clock:
    fake = Clock()
    monkeypatch.setattr(authentication, "time", fake)
    return fake


def _client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _key_reads(queries: Any) -> int:
    return sum(ApiKey._meta.db_table in q["sql"] and q["sql"].startswith("SELECT") for q in queries)


def test_cached_key_needs_no_query_and_still_checks_the_secret(tenant: Tenant, clock: Clock) -> None:
    _key, raw = create_api_key(user=tenant.user, name="ci")
    client = _client(raw)
    assert client.get("/api/v1/jobs").status_code == 200
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/api/v1/jobs").status_code == 200
    assert _key_reads(queries.captured_queries) == 0
    forged = raw[:-4] + ("AAAA" if not raw.endswith("AAAA") else "BBBB")
    assert _client(forged).get("/api/v1/jobs").status_code == 401


def test_revocation_elsewhere_takes_effect_within_the_ttl(tenant: Tenant, clock: Clock,
                                                           settings: Any) -> None:
    settings.API_KEY_CACHE_SECONDS = 5
    key, raw = create_api_key(user=tenant.user, name="ci")
    client = _client(raw)
    assert client.get("/api/v1/jobs").status_code == 200
    # Another process revokes it: this process's cache does not know yet.
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    clock.now += 4.9
    assert client.get("/api/v1/jobs").status_code == 200
    clock.now += 0.2
    assert client.get("/api/v1/jobs").status_code == 401


def test_revocation_in_this_process_is_immediate(tenant: Tenant, clock: Clock) -> None:
    key, raw = create_api_key(user=tenant.user, name="ci")
    client = _client(raw)
    assert client.get("/api/v1/jobs").status_code == 200
    revoke_api_key(api_key=key)
    assert client.get("/api/v1/jobs").status_code == 401


def test_deactivated_user_is_refused_within_the_ttl(tenant: Tenant, clock: Clock) -> None:
    _key, raw = create_api_key(user=tenant.user, name="ci")
    client = _client(raw)
    assert client.get("/api/v1/jobs").status_code == 200
    type(tenant.user).objects.filter(pk=tenant.user.pk).update(is_active=False)
    clock.now += 6
    assert client.get("/api/v1/jobs").status_code == 401


def test_expiry_is_exact_even_when_cached(tenant: Tenant, clock: Clock) -> None:
    expires_at = timezone.now() + timedelta(seconds=2)  # room for a slow first request
    _key, raw = create_api_key(user=tenant.user, name="ci", expires_at=expires_at)
    client = _client(raw)
    assert client.get("/api/v1/jobs").status_code == 200
    # The wall clock decides expiry; the cache's clock has not moved.
    time.sleep(max(0.0, (expires_at - timezone.now()).total_seconds()) + 0.05)
    response = client.get("/api/v1/jobs")
    assert response.status_code == 401 and "expired" in response.json()["detail"]


def test_cache_can_be_disabled(tenant: Tenant, clock: Clock, settings: Any) -> None:
    settings.API_KEY_CACHE_SECONDS = 0
    key, raw = create_api_key(user=tenant.user, name="ci")
    client = _client(raw)
    assert client.get("/api/v1/jobs").status_code == 200
    ApiKey.objects.filter(pk=key.pk).update(revoked_at=timezone.now())
    assert client.get("/api/v1/jobs").status_code == 401


def test_last_used_at_is_written_at_most_once_a_minute(tenant: Tenant, clock: Clock) -> None:
    key, raw = create_api_key(user=tenant.user, name="ci")
    assert key.last_used_at is None
    client = _client(raw)
    assert client.get("/api/v1/jobs").status_code == 200
    first = ApiKey.objects.get(pk=key.pk).last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            clock.now += 10
            assert client.get("/api/v1/jobs").status_code == 200
    assert not any(q["sql"].startswith("UPDATE") and ApiKey._meta.db_table in q["sql"]
                   for q in queries.captured_queries)
    assert ApiKey.objects.get(pk=key.pk).last_used_at == first
    # A minute later (this process's clock) and the row older than a minute: written again.
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=first - timedelta(seconds=61))
    clock.now += 31
    assert client.get("/api/v1/jobs").status_code == 200
    assert ApiKey.objects.get(pk=key.pk).last_used_at > first - timedelta(seconds=1)


def test_last_used_at_is_not_rewritten_when_another_process_just_did(tenant: Tenant,
                                                                     clock: Clock) -> None:
    key, raw = create_api_key(user=tenant.user, name="ci")
    recent = timezone.now() - timedelta(seconds=5)
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=recent)
    assert _client(raw).get("/api/v1/jobs").status_code == 200
    assert ApiKey.objects.get(pk=key.pk).last_used_at == recent


def test_key_uses_are_written_after_the_response_in_one_statement(db: Any, clock: Clock) -> None:
    # No tenant (no organization): schemathesis later in this directory probes org ids.
    user = UserFactory()
    keys = [create_api_key(user=user, name=f"k{i}") for i in range(3)]
    # Authenticate without finishing a request: the uses are only queued.
    for key, raw in keys:
        request = APIRequestFactory().get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Bearer {raw}")
        assert authentication.ApiKeyAuthentication().authenticate(request)[1].pk == key.pk
    assert ApiKey.objects.filter(last_used_at__isnull=False).count() == 0
    with CaptureQueriesContext(connection) as queries:
        authentication.flush_key_touches()
    updates = [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 1
    assert ApiKey.objects.filter(last_used_at__isnull=False).count() == 3
