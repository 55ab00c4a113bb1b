"""The idempotency completion carries the COMMIT when the request's transaction is outermost."""

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from accounts.models import IdempotencyRecord
from scheduling.models import Job
from scheduling.services import submission

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(api: APIClient, body: dict, key: str) -> Any:
    return api.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.mark.parametrize("inline", [True, False])
def test_submission_commits_with_its_completion(api: APIClient, job_body: Callable, settings: Any,
                                                monkeypatch: Any, inline: bool) -> None:
    settings.IDEMPOTENCY_COMMIT_INLINE = inline
    triggered: list[bool] = []
    monkeypatch.setattr(submission, "_schedule_soon", lambda: triggered.append(True))
    key = uuid.uuid4().hex
    with CaptureQueriesContext(connection) as queries:
        response = _submit(api, job_body(), key)
    assert response.status_code == 201, response.json()
    completion = [q["sql"] for q in queries.captured_queries
                  if q["sql"].startswith("UPDATE accounts_idempotencyrecord")]
    assert len(completion) == 1 and completion[0].endswith("; COMMIT") is inline
    assert not connection.in_atomic_block
    assert triggered == [True]  # on_commit hooks ran after the commit
    # Committed: visible from a new connection's point of view, and replayable.
    job_id = response.json()["id"]
    assert Job.objects.get(pk=job_id).current_hold_id == response.json()["hold"]["id"]
    assert IdempotencyRecord.objects.get(key=key).state == "done"
    replay = _submit(api, job_body(), key)
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert replay.json() == response.json()
    # The connection is usable afterwards, in and out of transactions.
    assert _submit(api, job_body(), uuid.uuid4().hex).status_code == 201


def test_failed_submission_still_rolls_back(api: APIClient, job_body: Callable) -> None:
    key = uuid.uuid4().hex
    response = _submit(api, job_body(gpu_count=10**3, max_wall_seconds=30 * 24 * 3600), key)
    assert response.status_code == 402, response.json()
    assert not Job.objects.exists() and not IdempotencyRecord.objects.filter(key=key).exists()
    assert _submit(api, job_body(), key).status_code == 201


def test_portable_path_used_by_embedded_sqlite(api: APIClient, job_body: Callable,
                                               monkeypatch: Any) -> None:
    """The claim and completion without PostgreSQL-only SQL (what `make run` on SQLite uses)."""
    from config.api import idempotency

    monkeypatch.setattr(idempotency, "_postgres", lambda: False)
    key = uuid.uuid4().hex
    first = _submit(api, job_body(), key)
    assert first.status_code == 201, first.json()
    assert Job.objects.get(pk=first.json()["id"]).current_hold_id == first.json()["hold"]["id"]
    replay = _submit(api, job_body(), key)
    assert replay["Idempotent-Replayed"] == "true" and replay.json() == first.json()
    assert _submit(api, job_body(name="other"), key).status_code == 422


def test_claim_bounds_only_its_own_wait(settings: Any) -> None:
    """The claim sets a short `lock_timeout` for its INSERT and puts the previous one back, on a
    fresh key and on an existing one, so later statements (bucket locks) wait as usual."""
    from django.db import transaction

    from config.api.idempotency import _claim

    settings.IDEMPOTENCY_LOCK_WAIT_MS = 1234

    def timeout() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW lock_timeout")
            return str(cursor.fetchone()[0])

    key = uuid.uuid4().hex
    with transaction.atomic():
        before = timeout()
        assert before != "1234ms"
        claimed = _claim("user:1", key, "fp")
        assert isinstance(claimed, tuple) and timeout() == before
        connection.cursor().execute(
            "UPDATE accounts_idempotencyrecord SET state = 'done', response_status = 200, "
            "response_body = '{}' WHERE id = %s", [claimed[0]])
    with transaction.atomic():
        replay = _claim("user:1", key, "fp")
        assert not isinstance(replay, tuple) and replay.status == 200
        assert timeout() == before
