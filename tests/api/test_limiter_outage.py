"""The rate limiter's Redis unreachable: a clear 503 problem, nothing written, nothing lost."""

import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger.models import Hold
from scheduling.models import Job
from tests.api.factories import Tenant

pytestmark = pytest.mark.django_db

DEAD_REDIS = "redis://127.0.0.1:1/0"  # nothing listens on port 1


def test_submission_with_redis_down_is_503_and_writes_nothing(
    settings: Any, api: APIClient, tenant: Tenant, job_body: Any
) -> None:
    settings.REDIS_URL = DEAD_REDIS
    response = api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
    assert response.status_code == 503, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert response.json()["type"] == "rate-limiter-unavailable"
    assert int(response["Retry-After"]) >= 1
    assert not Job.objects.exists() and not Hold.objects.exists()


def test_read_with_redis_down_is_503(settings: Any, api: APIClient) -> None:
    settings.REDIS_URL = DEAD_REDIS
    response = api.get("/api/v1/jobs")
    assert response.status_code == 503
    assert response.json()["type"] == "rate-limiter-unavailable"


def test_slot_release_failing_after_commit_keeps_the_201(
    monkeypatch: pytest.MonkeyPatch, api: APIClient, tenant: Tenant, job_body: Any
) -> None:
    """Redis lost between taking the in-flight slot and giving it back: the job is committed, so
    the answer stays 201 (a replay returns the same); the slot expires after its TTL."""
    import redis

    def lost(*args: Any, **kwargs: Any) -> None:
        raise redis.ConnectionError("connection lost")

    monkeypatch.setattr(redis.Redis, "zrem", lost)
    key = uuid.uuid4().hex
    response = api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert response.status_code == 201, response.content
    assert Job.objects.filter(pk=response.json()["id"]).exists()
    monkeypatch.undo()
    replay = api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY=key)
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert replay.json() == response.json()
