"""A refund while the budget's period is being counted afresh, on real connections.

The recount (`set_budget` redefining the period, a window opening) reads the captures and the
refunds laid on them; a refund committing in between was in neither: not subtracted by the recount,
and not credited to the new period it could not see yet. The refund now takes the org's
budget-definition lock shared (`budgets/scope_lock.py`), so it waits for the recount and then
credits the new period. Failed before (the window kept the refunded 3 as spent)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import transaction

from budgets.models import BudgetPeriod
from budgets.services import reserve_budgets, set_budget
from config.clock import db_now
from ledger.models import MICRO
from ledger.services import capture
from scheduling.services.refunds import refund_job
from tests.lock_waits import another_session_waits
from tests.metering.conftest import World, ensure_priority_classes
from tests.threads import Worker


@pytest.mark.django_db(transaction=True)
def test_a_refund_waits_for_a_recount_and_credits_the_new_period(make_attempt, funded, world: World) -> None:
    ensure_priority_classes()
    funded(100 * MICRO)
    budget, _ = set_budget(org=world.org, period="month", limit=50 * MICRO, enforcement="hard")
    attempt = make_attempt(hold_amount=10 * MICRO)
    reserve_budgets(hold=attempt.hold, org=world.org, project=world.project, user=world.user,
                    amount=10 * MICRO)
    capture(hold=attempt.hold, amount=4 * MICRO, key="run")
    counted, commit = threading.Event(), threading.Event()
    starts = db_now() - timedelta(days=1)

    def recount() -> None:  # finance makes the month a window: counted afresh, then a pause
        with transaction.atomic():
            set_budget(org=world.org, period="window", window_start=starts,
                       window_end=starts + timedelta(days=2), limit=50 * MICRO, enforcement="hard")
            counted.set()
            commit.wait(20)

    recounting = Worker(recount).start()
    assert counted.wait(10)
    refunding = Worker(lambda: refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node",
                                          key="r1")).start()
    waited = another_session_waits(refunding.done, wait_event="advisory")
    commit.set()
    recounting.join(), refunding.join()
    assert recounting.errors == refunding.errors == []
    assert waited, "the refund did not wait for the recount: no race"
    assert BudgetPeriod.objects.get(budget=budget, starts_at=starts).spent == MICRO


@pytest.mark.django_db(transaction=True)
def test_a_capture_cannot_commit_between_the_refunds_read_and_its_credit(
        make_attempt, funded, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review: the refund read the captures, then credited the hold's newest charge; the stranded-
    hold sweep (which captures under the hold lock alone) committed a capture in between, and the
    credit went to the period that counted that new, unrefunded capture. The refund locks the
    job's holds now: the sweep skips the hold meanwhile and settles it on its next run."""
    from budgets.models import RefundedCapture
    from budgets.services import _seed_current_period
    from ledger.clock import shifted
    from metering.models import AttemptUsage
    from metering.sweeps import _settle_stranded
    from scheduling.models import AttemptState, Job, JobAttempt, JobState
    from tests.metering.test_refund_budgets import _spend

    ensure_priority_classes()
    funded(100 * MICRO)
    budget, _ = set_budget(org=world.org, period="month", limit=50 * MICRO, enforcement="hard")
    attempt = make_attempt(hold_amount=20 * MICRO)
    reserve_budgets(hold=attempt.hold, org=world.org, project=world.project, user=world.user,
                    amount=20 * MICRO)
    with shifted(timedelta(hours=-3)):
        _spend(attempt.hold, 4 * MICRO, "early")
    now = db_now()
    starts = now - timedelta(hours=1)
    set_budget(org=world.org, period="window", window_start=starts, window_end=now + timedelta(hours=1),
               limit=50 * MICRO, enforcement="hard")  # the hold's newest charge: the window's, spent 0
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.ENDED, ended_at=now, outcome="failed")
    Job.objects.filter(pk=attempt.job_id).update(state=JobState.FAILED)
    AttemptUsage.objects.filter(attempt=attempt).update(reported_gpu_ms=6 * MICRO, billable_gpu_ms=6 * MICRO)

    import budgets.refunds as refunds

    original, read, go = refunds._credit_charges, threading.Event(), threading.Event()

    def paused(per_hold: dict[int, int]) -> dict[int, int]:
        read.set()
        assert go.wait(20)
        return original(per_hold)

    monkeypatch.setattr(refunds, "_credit_charges", paused)
    refunding = Worker(lambda: refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node",
                                          key="r1")).start()
    assert read.wait(20)
    during = _settle_stranded(attempt.hold_id)
    go.set()
    refunding.join()
    assert refunding.errors == []
    assert during == ""  # the hold was the refund's: skipped, not settled under it
    assert _settle_stranded(attempt.hold_id) == "settled"  # the next sweep captures the last 2
    window = BudgetPeriod.objects.get(budget=budget, starts_at=starts)
    budget.refresh_from_db()
    with transaction.atomic():
        recounted = _seed_current_period(budget, now=db_now()).spent
    assert list(RefundedCapture.objects.values_list("amount", flat=True)) == [3 * MICRO]
    assert window.spent == recounted == 2 * MICRO  # the new capture's 2, unrefunded
