"""Races through the whole HTTP stack on real PostgreSQL: no double spend, no double submit."""

import uuid
from collections import Counter

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.db.models import Sum

from accounts.models import IdempotencyRecord
from budgets.models import BudgetPeriod
from budgets.services import set_budget
from ledger.models import Bucket, Hold
from scheduling.models import Job
from tests.api.concurrency import run_concurrently, submit_call
from tests.api.conftest import H100_PRICE, client_for
from tests.api.factories import add_member, make_tenant

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ONE_JOB = H100_PRICE  # 1 x H100 for 1 hour


def body(project_id: int) -> dict:
    return {"project": project_id, "name": "race", "gpu_types": ["H100"], "gpu_count": 1,
            "max_wall_seconds": 3600, "priority_class": "batch"}


def test_200_submissions_against_funds_for_100(fleet: dict) -> None:
    tenant = make_tenant(funds=100 * ONE_JOB)
    clients = [client_for(tenant.user)] + [client_for(add_member(tenant.project)) for _ in range(3)]
    calls = [submit_call(clients[i % 4], body(tenant.project.pk), uuid.uuid4().hex) for i in range(200)]
    results = run_concurrently(calls)
    statuses = Counter(status for status, _, _ in results)
    assert statuses == {201: 100, 402: 100}, statuses
    assert {b["type"] for s, b, _ in results if s == 402} == {"insufficient-credits"}
    assert Job.objects.count() == Hold.objects.count() == 100
    bucket = Bucket.objects.get(org=tenant.org)
    assert (bucket.available, bucket.held) == (0, 100 * ONE_JOB)
    assert IdempotencyRecord.objects.count() == 100  # rejected requests leave no record
    call_command("verify_ledger")


def test_same_key_50_times_at_once_makes_one_job(fleet: dict) -> None:
    tenant = make_tenant(funds=100 * ONE_JOB)
    client = client_for(tenant.user)
    results = run_concurrently([submit_call(client, body(tenant.project.pk), "one-key")] * 50)
    # Duplicates wait on the first request's uncommitted idempotency row (up to
    # IDEMPOTENCY_LOCK_WAIT_MS = 5 s) and then replay it; none has to give up with 409 here.
    assert Counter(status for status, _, _ in results) == {201: 50}
    assert len({raw for _, _, raw in results}) == 1  # byte-identical bodies
    assert sum(not b["_replayed"] for _, b, _ in results) == 1
    assert Job.objects.count() == Hold.objects.count() == 1
    call_command("verify_ledger")


def test_duplicate_gives_up_with_409_while_original_is_in_flight(fleet: dict, settings: object) -> None:
    settings.IDEMPOTENCY_LOCK_WAIT_MS = 200  # type: ignore[attr-defined]
    tenant = make_tenant(funds=10 * ONE_JOB)
    client = client_for(tenant.user)
    # Play the in-flight original: an uncommitted record for (user, key) held by this thread.
    with transaction.atomic():
        IdempotencyRecord.objects.create(
            principal=f"user:{tenant.user.pk}", key="busy", fingerprint="x",
            created_at="2030-01-01T00:00:00Z", expires_at="2030-01-02T00:00:00Z",
        )
        [(status, payload, _)] = run_concurrently([submit_call(client, body(tenant.project.pk), "busy")])
        transaction.set_rollback(True)
    assert status == 409 and payload["type"] == "idempotency-key-in-flight"
    connection.close()
    assert Job.objects.count() == 0


def test_hard_project_budget_never_overshoots(fleet: dict) -> None:
    tenant = make_tenant(funds=1000 * ONE_JOB)
    set_budget(org=tenant.org, project=tenant.project, period="month", limit=10 * ONE_JOB,
               enforcement="hard")
    members = [client_for(add_member(tenant.project)) for _ in range(5)]
    calls = [submit_call(members[i % 5], body(tenant.project.pk), uuid.uuid4().hex) for i in range(40)]
    results = run_concurrently(calls)
    statuses = Counter(status for status, _, _ in results)
    assert statuses == {201: 10, 402: 30}, statuses
    assert {b["type"] for s, b, _ in results if s == 402} == {"budget-exceeded"}
    period = BudgetPeriod.objects.get(budget__project=tenant.project)
    assert period.held == 10 * ONE_JOB
    assert Hold.objects.aggregate(total=Sum("authorized"))["total"] == 10 * ONE_JOB
    call_command("verify_ledger")
