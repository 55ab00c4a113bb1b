"""settle_attempt: final capture at the fixed rate, exact release, exactly once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from ledger.models import MICRO, Bucket, HoldState
from ledger.verification import verify_ledger
from metering.heartbeats import HeartbeatItem
from metering.models import AttemptUsage
from metering.services import ingest_heartbeats, settle_attempt
from scheduling.models import JobAttempt
from tests.metering.conftest import World


def test_settle_captures_usage_cost_and_releases_rest_once(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    bucket = funded(100 * MICRO)
    a = make_attempt(hold_amount=10 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 6_000_000)])
    hold = settle_attempt(attempt=a, outcome="completed")
    assert (hold.state, hold.captured, hold.released) == (HoldState.SETTLED, 6 * MICRO, 4 * MICRO)
    again = settle_attempt(attempt=a, outcome="completed")
    assert (again.captured, again.released) == (6 * MICRO, 4 * MICRO)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.spent) == (94 * MICRO, 0, 6 * MICRO)
    u = AttemptUsage.objects.get(pk=a.pk)
    assert u.settled_at is not None and u.captured_gpu_ms == 6_000_000
    # Usage is frozen once settled: a late heartbeat moves nothing.
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 9, 9_000_000)])
    assert AttemptUsage.objects.get(pk=a.pk).billable_gpu_ms == 6_000_000
    assert Bucket.objects.get(pk=bucket.pk).spent == 6 * MICRO


def _settled_event(a: JobAttempt) -> Any:
    from audit.models import AuditEvent

    return AuditEvent.objects.get(action="metering.attempt_settled", subject_id=a.pk)


def test_usage_beyond_the_hold_is_never_captured_when_the_org_cannot_pay(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    funded(1 * MICRO)  # all of it on the hold
    a = make_attempt(hold_amount=1 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    hold = settle_attempt(attempt=a, outcome="completed")
    assert (hold.captured, hold.released) == (1 * MICRO, 0)
    data = _settled_event(a).data
    assert (data["extended_at_settlement"], data["unfunded"]) == (0, 4 * MICRO)
    assert verify_ledger() == []


def test_usage_beyond_the_hold_is_paid_at_settlement_when_the_org_can(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """QA: a run that overran its hold (a short job that ignored SIGTERM for its grace) and ended
    between two charge ticks was billed only what its hold covered, though its org could pay; one
    whose run spanned a tick was extended and paid in full."""
    bucket = funded(100 * MICRO)
    a = make_attempt(hold_amount=1 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    hold = settle_attempt(attempt=a, outcome="completed")
    assert (hold.captured, hold.released, hold.authorized) == (5 * MICRO, 0, 5 * MICRO)
    data = _settled_event(a).data
    assert (data["extended_at_settlement"], data["unfunded"]) == (4 * MICRO, 0)
    assert Bucket.objects.get(pk=bucket.pk).spent == 5 * MICRO
    assert verify_ledger() == []


def test_the_overrun_paid_at_settlement_stops_at_the_most_a_run_can_bill(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """Never beyond `max_cost` (max wall + the longest stop grace, the metering tolerance): usage
    past it is not the run's to pay, whatever the funds."""
    from metering.charging import max_cost
    from scheduling.models import Job

    funded(100 * MICRO)
    a = make_attempt(hold_amount=10_000, max_wall_seconds=1)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    ceiling = max_cost(a, Job.objects.get(pk=a.job_id))
    assert 10_000 < ceiling < 5_000_000
    hold = settle_attempt(attempt=a, outcome="timed_out")
    assert hold.captured == ceiling
    assert _settled_event(a).data["unfunded"] == 5_000_000 - ceiling


def test_reconciliation_flags_a_capture_that_disagrees_with_usage(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    from django.core.cache import cache

    from audit.models import AuditEvent
    from metering.metrics import RECONCILIATION_CACHE_KEY
    from metering.sweeps import reconcile

    funded(100 * MICRO)
    a = make_attempt(hold_amount=10 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 2_000_000)])
    settle_attempt(attempt=a, outcome="completed")
    from scheduling.models import AttemptState

    JobAttempt.objects.filter(pk=a.pk).update(state=AttemptState.ENDED, ended_at=timezone.now())
    assert reconcile().clean
    # Usage that moved after settlement (a bug elsewhere) no longer matches what was captured.
    AttemptUsage.objects.filter(pk=a.pk).update(billable_gpu_ms=2_500_000, reported_gpu_ms=2_500_000)
    found = reconcile()
    assert found.counts()["captured_mismatch"] == 1
    assert AuditEvent.objects.filter(
        action="metering.reconciliation_alert", reason_code="captured_mismatch"
    ).exists()
    assert cache.get(RECONCILIATION_CACHE_KEY)["counts"]["captured_mismatch"] == 1
    metrics = Client().get("/metrics").content.decode()
    assert 'gpubank_reconciliation_discrepancies{check="captured_mismatch"} 1.0' in metrics


def test_reconciliation_counts_what_was_released_before_settlement(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """Review: a run that used more than its hold kept after an early release (the excess given
    back at placement) was captured what the hold had left, and reconciliation compared that with
    the whole authorization: a false mismatch."""
    from ledger.services import release_partial
    from metering.sweeps import reconcile
    from scheduling.models import AttemptState

    funded(100 * MICRO)
    a = make_attempt(hold_amount=10 * MICRO)
    release_partial(hold=a.hold, amount=4 * MICRO, key="placed-cheaper")
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 8_000_000)])  # costs 8 credits
    hold = settle_attempt(attempt=a, outcome="completed")
    # What it held, then the overrun its org could pay at settlement: all it may bill (8 credits
    # claimed, capped by the server's clock at 1 h x 2 GPUs + 1 % + the 5 s slack per GPU).
    billable = AttemptUsage.objects.get(pk=a.pk).billable_gpu_ms
    assert billable == 3600 * 2 * 1010 + 2 * 5000
    assert (hold.captured, hold.released) == (billable, 4 * MICRO)  # 1 micro-credit per GPU-ms
    JobAttempt.objects.filter(pk=a.pk).update(state=AttemptState.ENDED, ended_at=timezone.now())
    assert reconcile().clean
    # Captured less than the hold held at settlement: still flagged.
    from ledger.models import Hold

    Hold.objects.filter(pk=hold.pk).update(captured=billable - MICRO, released=5 * MICRO)
    assert reconcile().counts()["captured_mismatch"] == 1


@pytest.mark.parametrize(("limit", "paid"), [(2 * MICRO, 2 * MICRO), (10 * MICRO, 5 * MICRO)])
def test_a_hard_budget_pays_as_much_of_the_overrun_as_it_has_room_for(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt], limit: int, paid: int,
) -> None:
    """The overrun is an extension like a charge tick's: a hard budget it would pass refuses the
    whole of it; then the most the budget has room for is extended (to within 1 % of the overrun:
    QA, all or nothing left an org short of the whole paying none of it) and the rest recorded as
    unfunded; the budget counts what was captured."""
    from budgets.models import BudgetPeriod
    from budgets.services import set_budget

    funded(100 * MICRO)
    a = make_attempt(hold_amount=1 * MICRO)
    set_budget(org=world.org, period="month", limit=limit, enforcement="hard")  # counts the hold
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    hold = settle_attempt(attempt=a, outcome="completed")
    assert paid - 4 * MICRO // 100 <= hold.captured <= paid  # within 1 % of the 4-credit overrun
    assert _settled_event(a).data["unfunded"] == 5 * MICRO - hold.captured
    period = BudgetPeriod.objects.get(budget__org=world.org)
    assert (period.spent, period.held) == (hold.captured, 0)
    assert period.spent <= limit
    assert verify_ledger() == []


def test_an_org_short_of_the_whole_overrun_pays_what_it_has(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """QA: 26,943 available against a 33,546 overrun paid none of it."""
    bucket = funded(3 * MICRO + 500_000)  # the 1-credit hold, then 2.5 credits left for a 4-credit overrun
    a = make_attempt(hold_amount=1 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    hold = settle_attempt(attempt=a, outcome="completed")
    assert 3 * MICRO + 500_000 - 4 * MICRO // 100 <= hold.captured <= 3 * MICRO + 500_000
    assert _settled_event(a).data["unfunded"] == 5 * MICRO - hold.captured
    assert Bucket.objects.get(pk=bucket.pk).spent == hold.captured
    assert verify_ledger() == []


def test_an_extension_says_in_the_journal_what_it_was_for(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """QA: extensions had an empty memo in the journal and no reason in their audit event, while
    holds and captures name the job and attempt."""
    from audit.models import AuditEvent
    from ledger.models import LedgerTransaction

    funded(100 * MICRO)
    a = make_attempt(hold_amount=1 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    settle_attempt(attempt=a, outcome="completed")
    txn = LedgerTransaction.objects.get(kind="extend")
    assert txn.memo == f"job {a.job_id} attempt {a.number} overrun at settlement"
    event = AuditEvent.objects.get(action="ledger.extend")
    assert event.data["reason"] == txn.memo
