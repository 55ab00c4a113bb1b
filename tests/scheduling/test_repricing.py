"""A price rise between a job's hold and its placement: the hold is topped up first, or the job
waits for funds (reason `budget`) and nothing is placed on credit the hold does not hold."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from audit.models import AuditEvent
from budgets.services import set_budget
from config.clock import db_now
from ledger.models import Hold
from ledger.services import place_hold
from ledger.verification import verify_ledger
from scheduling.models import Allocation, AttemptState, GpuPrice, Job, JobAttempt, JobState
from scheduling.services.tick import run_scheduling_pass
from tests.factories import fund
from tests.scheduling.conftest import A100_PRICE, H100_PRICE, priority

pytestmark = pytest.mark.django_db

MICRO = 1_000_000
NEW_PRICE = 3 * H100_PRICE


def _job_held_at_the_old_price(tenant: dict[str, Any], make_job: Callable[..., Job]) -> tuple[Job, Hold]:
    """A queued 2 x H100 job for 1 h whose hold was priced before H100 tripled in price."""
    hold = place_hold(org=tenant["org"], amount=2 * H100_PRICE, key="held", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    job = make_job(JobState.QUEUED, current_hold=hold, estimate=hold.authorized, gpu_types=["H100"],
                   gpu_count=2, max_wall_seconds=3600)
    return job, hold


def _raise_h100(fleet: dict[str, Any]) -> None:
    # The DB clock is the test transaction's start: a price from just before it is in effect.
    GpuPrice.objects.create(gpu_type=fleet["h100"], price_per_gpu_hour=NEW_PRICE,
                            effective_from=db_now() - timedelta(seconds=1))


def test_a_dearer_placement_tops_the_hold_up_before_it_runs(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    fund(tenant["org"], 100 * MICRO)
    job, hold = _job_held_at_the_old_price(tenant, make_job)
    _raise_h100(fleet)

    run_scheduling_pass(trigger="test")

    attempt = JobAttempt.objects.get(job=job)
    assert attempt.rate_per_gpu_hour == NEW_PRICE
    hold.refresh_from_db()
    # The hold now covers the run at the rate it is billed at: nothing can end up unfunded.
    assert (hold.authorized, hold.remaining) == (2 * NEW_PRICE, 2 * NEW_PRICE)
    job.refresh_from_db()
    assert (job.state, job.estimate) == (JobState.SCHEDULED, 2 * NEW_PRICE)
    event = AuditEvent.objects.get(action="sched.hold.top_up", subject_id=str(job.pk))
    assert event.data["amount"] == 2 * (NEW_PRICE - H100_PRICE) and event.data["rate"] == NEW_PRICE
    assert verify_ledger() == []


def test_a_top_up_under_a_hold_window_prices_the_estimate_for_the_whole_run(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    """The hold covers the org's window (30 min) at the new rate; the estimate, the max wall time
    (4 h) at that rate (it was set to the topped-up hold)."""
    fund(tenant["org"], 100 * MICRO)
    tenant["org"].hold_window_seconds = 1800
    tenant["org"].save(update_fields=["hold_window_seconds"])
    hold = place_hold(org=tenant["org"], amount=H100_PRICE, key="held", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    job = make_job(JobState.QUEUED, current_hold=hold, estimate=8 * H100_PRICE, gpu_types=["H100"],
                   gpu_count=2, max_wall_seconds=4 * 3600)
    _raise_h100(fleet)

    run_scheduling_pass(trigger="test")

    hold.refresh_from_db()
    assert hold.authorized == NEW_PRICE  # 2 GPUs x 30 min
    job.refresh_from_db()
    assert (job.state, job.estimate) == (JobState.SCHEDULED, 8 * NEW_PRICE)
    assert verify_ledger() == []


@pytest.mark.parametrize("refusal", ["credits", "budget"])
def test_a_refused_top_up_leaves_the_job_waiting_for_funds(
    refusal: str, fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    if refusal == "credits":
        fund(tenant["org"], 2 * H100_PRICE)  # exactly the old hold: nothing left to top up with
    else:
        fund(tenant["org"], 100 * MICRO)
    job, hold = _job_held_at_the_old_price(tenant, make_job)
    if refusal == "budget":
        set_budget(org=tenant["org"], period="month", limit=H100_PRICE, enforcement="hard")
    _raise_h100(fleet)

    run_scheduling_pass(trigger="test")

    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.wait_reason == "budget"
    # Every amount in credits, as the portal shows money (review: the rate was in micro-credits).
    assert job.wait_detail.startswith("H100 now costs 9.00 credits per GPU-hour, more than the hold was")
    refused = {"credits": "Needs 12.00 credits, only 0.00 available.",
               "budget": "The org budget allows 3.00 credits this period; 6.00 are used or held and 12.00"}
    assert f"topping the hold up by 12.00 credits was refused: {refused[refusal]}" in job.wait_detail
    assert "refused" in job.wait_detail and job.price_capped_until is not None and job.not_before is None
    assert not JobAttempt.objects.filter(job=job).exists()
    assert not Allocation.objects.exists()  # its GPUs were left for others
    hold.refresh_from_db()
    assert (hold.state, hold.authorized) == ("active", 2 * H100_PRICE)  # unchanged, still held
    skipped = AuditEvent.objects.filter(action="sched.skip", subject_id=str(job.pk), reason_code="budget")
    assert skipped.exists()
    assert verify_ledger() == []

    # Until its retry time it is not placed on H100 again (no top-up tried); the refusal's words stay.
    run_scheduling_pass(trigger="test")
    job.refresh_from_db()
    assert job.wait_reason == "budget" and job.wait_detail.startswith("H100 now costs 9.00 credits")
    assert AuditEvent.objects.filter(action="sched.hold.top_up").count() == 0
    assert not JobAttempt.objects.filter(job=job).exists()

    # Funds arrive; once its retry time has passed the job is placed at the new price.
    fund(tenant["org"], 100 * MICRO)
    if refusal == "budget":
        set_budget(org=tenant["org"], period="month", limit=100 * MICRO, enforcement="hard")
    Job.objects.filter(pk=job.pk).update(price_capped_until=db_now() - timedelta(seconds=1))
    run_scheduling_pass(trigger="test")
    attempt = JobAttempt.objects.get(job=job)
    hold.refresh_from_db()
    assert attempt.rate_per_gpu_hour == NEW_PRICE and hold.remaining == 2 * NEW_PRICE


def test_a_refused_top_up_runs_the_job_at_once_on_a_type_its_hold_covers(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    """Review: a job accepting H100 then A100, its hold priced at H100's old price; H100's price
    triples and the top-up is refused. It used to wait `budget` until the retry time, and again
    after it, while an A100 node its hold covers sat free. Now the next pass places it there."""
    from scheduling.models import Node, NodeState

    Node.objects.create(name="a100-1", region=fleet["region"], gpu_type=fleet["a100"], gpu_count=8,
                        state=NodeState.READY, last_heartbeat_at=db_now(), ib_group="ib1")
    fund(tenant["org"], 2 * H100_PRICE)  # exactly the hold: nothing left to top up with
    hold = place_hold(org=tenant["org"], amount=2 * H100_PRICE, key="held", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100", "A100"])
    job = make_job(JobState.QUEUED, current_hold=hold, estimate=hold.authorized,
                   gpu_types=["H100", "A100"], gpu_count=2, max_wall_seconds=3600)
    _raise_h100(fleet)

    run_scheduling_pass(trigger="test")  # H100 first: its top-up is refused
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.wait_reason == "budget"
    assert job.wait_detail.startswith("H100 now costs")

    run_scheduling_pass(trigger="test")  # at once, on A100 (the hold covers its price)
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.rate_per_gpu_hour == A100_PRICE
    assert Allocation.objects.filter(attempt=attempt, node__gpu_type=fleet["a100"]).count() == 2
    hold.refresh_from_db()
    assert hold.authorized == 2 * H100_PRICE  # no top-up; the excess over A100 was released
    assert AuditEvent.objects.filter(action="sched.hold.top_up").count() == 0
    assert verify_ledger() == []


def _production_behind_a_batch_job(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> tuple[JobAttempt, Job, Hold]:
    """A batch job on all 8 H100s for 2 h (8 h of wall left), and an 8 x H100 production job for
    1 h whose hold was priced at H100's old price."""
    since = db_now() - timedelta(hours=2)
    running = place_hold(org=tenant["org"], amount=MICRO, key="victim", project=tenant["project"],
                         user=tenant["user"], gpu_types=["H100"])
    victim = make_job(JobState.RUNNING, gpu_count=8, priority_class=priority("batch"),
                      max_wall_seconds=36_000, current_hold=running, estimate=MICRO)
    attempt = make_attempt(victim, AttemptState.RUNNING, started_at=since, scheduled_at=since)
    for i in range(8):
        Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=i, allocated_at=since)
    hold = place_hold(org=tenant["org"], amount=8 * H100_PRICE, key="urgent", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    urgent = make_job(JobState.QUEUED, current_hold=hold, estimate=hold.authorized, gpu_types=["H100"],
                      gpu_count=8, max_wall_seconds=3600, priority_class=priority("production"),
                      preemptible=False)
    return attempt, urgent, hold


def test_no_victim_is_stopped_for_a_run_whose_top_up_is_refused(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> None:
    """Review: the top-up came at placement, after the victims had stopped; refused, the preemptor
    did not run and they had been stopped for nothing. Now it comes first, and nothing stops."""
    fund(tenant["org"], MICRO + 8 * H100_PRICE)  # exactly the two holds
    attempt, urgent, hold = _production_behind_a_batch_job(fleet, tenant, make_job, make_attempt)
    _raise_h100(fleet)

    row = run_scheduling_pass(trigger="test")

    assert row is not None and row.preempted == 0
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING and attempt.stop_requested_at is None
    assert not AuditEvent.objects.filter(action="sched.preempt").exists()
    urgent.refresh_from_db()
    assert urgent.wait_reason == "budget" and "refused" in urgent.wait_detail
    assert urgent.price_capped_until is not None
    hold.refresh_from_db()
    assert hold.authorized == 8 * H100_PRICE
    # While capped it preempts nothing either (H100 costs more than its hold pays).
    assert run_scheduling_pass(trigger="test").preempted == 0  # type: ignore[union-attr]
    assert verify_ledger() == []


def test_a_preemption_for_a_dearer_run_tops_the_hold_up_first(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> None:
    """And with the funds, a price rise does not stop preemption (review: an attempt that filtered
    victims by what the hold pays stopped all of them after any rise)."""
    fund(tenant["org"], 100 * MICRO)
    attempt, urgent, hold = _production_behind_a_batch_job(fleet, tenant, make_job, make_attempt)
    _raise_h100(fleet)

    row = run_scheduling_pass(trigger="test")

    assert row is not None and row.preempted == 1
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.STOPPING
    hold.refresh_from_db()
    assert hold.authorized == 8 * NEW_PRICE
    event = AuditEvent.objects.get(action="sched.hold.top_up", subject_id=str(urgent.pk))
    assert event.data["amount"] == 8 * (NEW_PRICE - H100_PRICE)
    urgent.refresh_from_db()
    assert urgent.wait_reason == "waiting-for-preemption"
    assert verify_ledger() == []


def test_no_victim_is_stopped_for_a_preemptor_held_since_the_snapshot(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review: only preemptors needing a top-up were re-read under lock; one its user held between
    the snapshot and the write still had its victims stopped."""
    from scheduling.services import tick

    fund(tenant["org"], 100 * MICRO)
    attempt, urgent, _hold = _production_behind_a_batch_job(fleet, tenant, make_job, make_attempt)
    apply = tick.apply_result

    def held_meanwhile(**kwargs: Any) -> Any:
        Job.objects.filter(pk=urgent.pk).update(held=True)
        return apply(**kwargs)

    monkeypatch.setattr(tick, "apply_result", held_meanwhile)
    row = run_scheduling_pass(trigger="test")
    assert row is not None and row.preempted == 0
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING and attempt.stop_requested_at is None


def test_a_hold_topped_up_for_a_preemption_gives_back_what_a_later_cut_in_price_leaves(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> None:
    """Review: topped up at the higher price when its victim was signalled, the hold kept the
    difference after the price came back down and the job was placed at the lower one."""
    fund(tenant["org"], 100 * MICRO)
    attempt, urgent, hold = _production_behind_a_batch_job(fleet, tenant, make_job, make_attempt)
    _raise_h100(fleet)
    assert run_scheduling_pass(trigger="test").preempted == 1  # type: ignore[union-attr]
    GpuPrice.objects.create(gpu_type=fleet["h100"], price_per_gpu_hour=H100_PRICE,
                            effective_from=db_now() - timedelta(milliseconds=500))
    from scheduling.services.lifecycle import finish_attempt

    finish_attempt(attempt=JobAttempt.objects.get(pk=attempt.pk), outcome="preempted")
    run_scheduling_pass(trigger="test")
    placed = JobAttempt.objects.get(job=urgent)
    assert placed.rate_per_gpu_hour == H100_PRICE
    hold.refresh_from_db()
    assert hold.remaining == 8 * H100_PRICE  # the top-up given back
    assert verify_ledger() == []
