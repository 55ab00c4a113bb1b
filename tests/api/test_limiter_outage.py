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


@pytest.fixture
def silent_redis() -> Any:
    """A TCP server that accepts connections and never answers (a hung Redis)."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def test_hung_redis_costs_the_timeout_not_the_thread(
    settings: Any, api: APIClient, tenant: Tenant, job_body: Any, silent_redis: str
) -> None:
    import time

    settings.REDIS_URL = silent_redis
    settings.API_REDIS_TIMEOUT_SECONDS = 0.3
    started = time.monotonic()
    response = api.post("/api/v1/jobs", job_body(), format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
    assert response.status_code == 503 and response.json()["type"] == "rate-limiter-unavailable"
    assert time.monotonic() - started < 3  # the setting, not the client library's default (~5 s here)
    assert not Job.objects.exists()
