"""Review: ending an attempt that is requeued (preempted / lost / evicted / withdrawn) settles the
old hold and places the new one in ONE transaction (lifecycle.finish_attempt -> requeue ->
fund_job). The settlement locked the old hold's buckets (and the org's audit chain head), then the
new hold locked the budget periods and every eligible bucket by id: not in the order of DESIGN.md §6
("... -> budget rows -> buckets by id"), so a concurrent hold placement/extension of the same org
(which takes them in that order) deadlocked with it. Fixed by `lifecycle.lock_ledger_for_requeue`,
which takes all of them ahead, in order, before the settlement.

Here the org has a paid bucket B1 and a later promotional grant B2 (spent first, so the old hold
drew only on B2). Retries are switched off (each worker runs inside its own atomic block, so
retry_on_conflict does not retry) to show the 40P01 PostgreSQL raised; in production the victim was
retried after deadlock_timeout (report_exit up to 4 times, then 503; the node sweep's _end_lost
not at all: it logged and waited for the next sweep).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from audit.models import AuditChainHead
from ledger.models import MICRO, BucketKind, HoldState
from metering.charging import charge_progress
from metering.reports import ExitReport, report_exit
from scheduling.models import AttemptState, JobAttempt, JobState, Node, NodeState
from scheduling.services.tick import end_attempts_on_down_nodes
from tests.factories import fund
from tests.metering.conftest import World
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def _waiting_sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                       "AND pid <> pg_backend_pid() AND datname = current_database()")
        return cursor.fetchone()[0]


def _wait_for(n: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _waiting_sessions() >= n:
            return True
        time.sleep(0.02)
    return False


def _race_with_a_charge(world: World, extending: JobAttempt, end: Callable[[], Any],
                        racer: Callable[[], Any] | None = None) -> list[str]:
    """Run `end` (an attempt's transient end, in a transaction without retry) while the org's audit
    chain head is briefly held, then a charge that extends `extending`'s hold (or `racer`, another
    placement of the org's); their errors."""
    chain = f"org:{world.org.pk}"
    assert AuditChainHead.objects.filter(chain=chain).exists()
    locked, release = threading.Event(), threading.Event()

    def hold_the_org_audit_head() -> None:  # any writer of the org's audit chain, briefly
        with transaction.atomic():
            AuditChainHead.objects.select_for_update().get(chain=chain)
            locked.set()
            release.wait(30)

    def charge() -> Any:
        with transaction.atomic():
            return charge_progress(attempt=extending)

    blocker = Worker(hold_the_org_audit_head).start()
    assert locked.wait(10)
    ending = Worker(end).start()
    assert _wait_for(1)  # the end settled the old hold and waits for the audit head
    charger = Worker(racer or charge).start()
    assert _wait_for(2)  # the extension (placement) waits for a bucket
    release.set()
    for worker in (blocker, ending, charger):
        worker.join()
    return [f"end: {e!r}" for e in ending.errors] + [f"racer: {e!r}" for e in charger.errors]


def _assert_requeued_with_a_fresh_hold(attempt: JobAttempt, outcome: str) -> None:
    attempt.refresh_from_db()
    job = attempt.job
    job.refresh_from_db()
    assert (attempt.state, attempt.outcome) == (AttemptState.ENDED, outcome)
    assert attempt.hold.state == HoldState.SETTLED
    assert job.state == JobState.QUEUED
    assert job.current_hold_id not in (None, attempt.hold_id)
    assert job.current_hold.state == HoldState.ACTIVE


def test_down_node_sweep_requeue_does_not_deadlock_with_a_hold_extension(
    world: World, make_attempt: Callable[..., JobAttempt]
) -> None:
    """The same inversion through the node sweep's `_end_lost`, which has no retry at all."""
    other = Node.objects.create(name="h100-2", region=world.region, gpu_type=world.h100, gpu_count=8,
                                state=NodeState.READY)
    fund(world.org, 100 * MICRO)
    fund(world.org, 100 * MICRO, kind=BucketKind.PROMOTIONAL)
    ending = make_attempt(hold_amount=10 * MICRO, started_ago=600, gpus=(0, 1))
    extending = make_attempt(hold_amount=300_000, started_ago=1, gpus=(2, 3), node=other)
    Node.objects.filter(pk=world.node.pk).update(state=NodeState.DOWN)

    errors = _race_with_a_charge(world, extending, end_attempts_on_down_nodes)
    assert errors == [], errors
    _assert_requeued_with_a_fresh_hold(ending, "lost")


@pytest.mark.parametrize("racer", ["charge", "charge-budgeted", "submission"])
def test_requeue_after_preemption_does_not_deadlock_with_a_hold_placement(
    world: World, make_attempt: Callable[..., JobAttempt], submit: Callable[..., Any], racer: str
) -> None:
    """The reviewer's case (the charge's extension), the same under an org budget (the old hold
    counts in no period, so only the new hold and the extension lock its current one: periods
    before buckets), and a same-org submission placing a hold."""
    if racer == "charge-budgeted":
        from budgets.services import set_budget

        set_budget(org=world.org, period="month", limit=1_000 * MICRO, enforcement="hard")
    fund(world.org, 100 * MICRO)  # B1: paid, lower id
    fund(world.org, 100 * MICRO, kind=BucketKind.PROMOTIONAL)  # B2: promotional, spent first
    ending = make_attempt(hold_amount=10 * MICRO, started_ago=600, gpus=(0, 1))  # hold on B2 only
    # Another running job of the org whose hold is below its look-ahead: the charge extends it.
    extending = make_attempt(hold_amount=300_000, started_ago=1, gpus=(2, 3))

    def preempted_exit() -> Any:
        with transaction.atomic():  # no retry: show the conflict
            return report_exit(node=world.node, attempt_id=ending.pk,
                               report=ExitReport(seq=1, cumulative_gpu_ms=1_000_000, outcome="preempted"))

    def submission() -> Any:
        with transaction.atomic():  # no retry either
            return submit(gpus=1, max_wall_seconds=600)

    errors = _race_with_a_charge(world, extending, preempted_exit,
                                 racer=submission if racer == "submission" else None)
    assert errors == [], errors
    _assert_requeued_with_a_fresh_hold(ending, "preempted")
