"""charge_progress: incremental captures keyed by total, window-by-window extension, out_of_credit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from audit.models import AuditEvent
from ledger.models import MICRO, Hold
from metering.charging import Action, lookahead_cost
from metering.conf import lookahead_seconds, window_floor_seconds
from metering.heartbeats import HeartbeatItem
from metering.services import charge_progress, ingest_heartbeats, report_started
from scheduling.models import AttemptState, Job, JobAttempt
from tests.metering.conftest import World, mark_node_alive, place_pending, shift_started

WINDOW = 2 * 600 * 1000  # 2 GPUs x 10 min at 1 micro-credit per GPU-ms


def running(world: World, submit: Callable[..., Job], window: int = 600) -> JobAttempt:
    world.org.hold_window_seconds = window
    world.org.save(update_fields=["hold_window_seconds"])
    mark_node_alive(world.node)
    submit(gpus=2, max_wall_seconds=36_000)
    [attempt] = place_pending()
    report_started(node=world.node, attempt_id=attempt.pk)
    shift_started(attempt, 36_000)
    return attempt


def test_progress_captures_are_incremental_and_never_repeat(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    funded(100 * MICRO)
    attempt = running(world, submit)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, 100_000)])
    assert charge_progress(attempt=attempt).captured == 100_000
    assert charge_progress(attempt=attempt).captured == 0  # nothing new: nothing captured
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 2, 250_001)])
    assert charge_progress(attempt=attempt).captured == 150_001
    assert Hold.objects.get(pk=attempt.hold_id).captured == 250_001


def test_hold_is_extended_by_one_window_when_funds_allow(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    funded(100 * MICRO)
    attempt = running(world, submit)
    assert Hold.objects.get(pk=attempt.hold_id).authorized == WINDOW
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, WINDOW - 100_000)])
    result = charge_progress(attempt=attempt)
    assert result.actions == (Action.CAPTURED, Action.EXTENDED)
    assert result.extended == WINDOW * 101 // 100
    assert Hold.objects.get(pk=attempt.hold_id).authorized == WINDOW + WINDOW * 101 // 100
    assert charge_progress(attempt=attempt).actions == ()  # enough headroom now: idempotent


def test_unfundable_window_stops_the_attempt_out_of_credit(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    funded(WINDOW + 200_000)  # the first window, and less than the look-ahead's 363,600 more
    attempt = running(world, submit)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, WINDOW - 100_000)])
    result = charge_progress(attempt=attempt)
    assert result.actions == (Action.CAPTURED, Action.STOPPED)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.stop_reason) == (AttemptState.STOPPING, "out_of_credit")
    # The stop reaches the agent in the next heartbeat response.
    stop = ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 2, WINDOW - 90_000)]).stop
    assert stop == [{"attempt_id": attempt.pk, "reason": "out_of_credit", "grace_seconds": 30}]
    # It ends out_of_credit, and the job says why in words (QA: only the audit trail did).
    from metering.reports import ExitReport, report_exit

    report_exit(node=world.node, attempt_id=attempt.pk,
                report=ExitReport(seq=3, cumulative_gpu_ms=WINDOW - 80_000, outcome="out_of_credit"))
    job = Job.objects.get(pk=attempt.job_id)
    assert (job.state, job.end_reason) == ("failed", "out_of_credit")
    assert job.end_detail.startswith("its hold could not be extended by ")
    from scheduling.api.serializers import JobDetailSerializer

    [shown] = JobDetailSerializer(job).data["attempts"]
    assert (shown["stop_reason"], shown["stop_detail"]) == ("out_of_credit", job.end_detail)
    assert "available" in job.end_detail  # the ledger's refusal: what was needed, what was there


def test_a_hold_that_pays_for_the_whole_run_is_never_stopped_for_the_metering_slack(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    """QA: a job whose hold covered its whole max wall time was stopped `out_of_credit` in its last
    minutes when the org had nothing left: the refused extension was only the metering tolerance
    beyond the run (1 % and 5 s per GPU), which the agent's wall-time stop never lets it use."""
    funded(2 * 300 * 1000)  # exactly the hold: 2 GPUs x 300 s, nothing spare
    mark_node_alive(world.node)
    submit(gpus=2, max_wall_seconds=300)
    [attempt] = place_pending()
    report_started(node=world.node, attempt_id=attempt.pk)
    shift_started(attempt, 300)
    hold = Hold.objects.get(pk=attempt.hold_id)
    assert hold.authorized == 2 * 300 * 1000
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, 2 * 200 * 1000)])
    result = charge_progress(attempt=attempt)  # 200 s in: less than the look-ahead left
    assert result.actions == (Action.CAPTURED,)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING and attempt.stop_reason == ""
    # A hold one micro-credit short of the run is still stopped when it cannot be extended.
    from ledger.services import release_partial

    release_partial(hold=hold, amount=1, key="short")
    assert charge_progress(attempt=attempt).actions == (Action.EXTENDED,)  # by that 1 again
    release_partial(hold=hold, amount=1, key="short-again")
    from ledger.models import Bucket
    from ledger.services import void_credits

    void_credits(bucket=Bucket.objects.get(org=world.org), reason="gone", key="v", amount=1)
    assert charge_progress(attempt=attempt).actions == (Action.STOPPED,)


def test_a_remainder_less_than_a_window_funds_the_look_ahead_until_it_cannot(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    """Extensions were all or nothing: with credits for less than one more window the job was
    stopped while they could still pay for minutes of its run."""
    funded(WINDOW + 500_000)  # the first window, and less than a second one
    attempt = running(world, submit)
    lookahead = lookahead_cost(attempt)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, WINDOW - 100_000)])
    result = charge_progress(attempt=attempt)
    assert result.actions == (Action.CAPTURED, Action.EXTENDED)
    assert result.extended == lookahead - 100_000  # just back up to the look-ahead
    hold = Hold.objects.get(pk=attempt.hold_id)
    assert (hold.authorized, hold.remaining) == (WINDOW + lookahead - 100_000, lookahead)
    # It runs on; 200,000 later the shortfall (300,000) is more than the 236,400 credits left: stopped.
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 2, WINDOW + 200_000)])
    result = charge_progress(attempt=attempt)
    assert result.actions == (Action.CAPTURED, Action.STOPPED)
    hold.refresh_from_db()
    assert hold.captured == WINDOW + 200_000 and hold.remaining == lookahead - 300_000


def test_a_window_shorter_than_the_look_ahead_still_keeps_the_hold_ahead_of_usage(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    """An org's window may be as short as 60 s, one charge interval, less than the look-ahead
    (2 charges + a heartbeat + the longest stop's grace = 270 s). One window per charge only kept pace:
    a late charge left usage past the hold, and a refused extension's graceful stop had no margin."""
    funded(100 * MICRO)
    attempt = running(world, submit, window=60)
    hold = Hold.objects.get(pk=attempt.hold_id)
    # Held for no less than the look-ahead, 270 s x 1.01 rounded up (review: a 60 s first hold
    # was stopped at its first charge when it could not be extended, and ran on past it unpaid).
    assert (lookahead_seconds(), window_floor_seconds()) == (270, 273)
    assert hold.authorized == 2 * 273 * 1000
    lookahead = lookahead_cost(attempt)
    assert lookahead == 2 * 270 * 1000 * 101 // 100
    used = 0
    for seq, seconds in enumerate((55, 60, 60, 150, 60), start=1):  # 2 GPUs; one charge 90 s late
        used += 2 * seconds * 1000
        ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, seq, used)])
        assert Action.EXTENDED in charge_progress(attempt=attempt).actions
        hold.refresh_from_db()
        assert hold.captured == used  # nothing left behind the hold
        assert hold.remaining >= lookahead  # the next charges and a graceful stop are covered


def test_a_short_window_admits_only_a_job_its_credits_can_stop_in_time(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    """Review: with a 60 s window the first hold paid for 60 s while the look-ahead is longer; with
    nothing more to extend by, the job was stopped at its first charge and ran on past its hold
    until the stop took effect (the next heartbeat, then the 30 s grace), unpaid. Its first hold
    now pays for the look-ahead, so the stop's run is covered."""
    from django.db import transaction

    from ledger.errors import InsufficientCredits

    funded(2 * 100 * 1000)  # 100 s of the 2 GPUs: the window's 60 s, not the look-ahead's 273
    world.org.hold_window_seconds = 60
    world.org.save(update_fields=["hold_window_seconds"])
    with pytest.raises(InsufficientCredits), transaction.atomic():
        submit(gpus=2, max_wall_seconds=36_000)
    funded(2 * 173 * 1000)  # now 273 s of them: admitted, and stopped with its run paid for
    attempt = running(world, submit, window=60)
    used = 2 * 60 * 1000
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, used)])
    assert charge_progress(attempt=attempt).actions == (Action.CAPTURED, Action.STOPPED)
    hold = Hold.objects.get(pk=attempt.hold_id)
    # The stop reaches the agent within a heartbeat (30 s) and the job ends within its grace (30 s).
    assert hold.remaining >= 2 * (30 + 30) * 1000, (hold.authorized, hold.captured, hold.released)


def test_a_windowed_hold_is_extended_to_the_whole_run_with_the_orgs_last_credits(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    """QA: an org with a hold window, funded with exactly its job's estimate, had the job stopped
    `out_of_credit` in its last look-ahead: a window was refused, then the look-ahead's shortfall,
    and what would have made the hold pay for the whole run (all the org had left) was never
    asked for."""
    world.org.hold_window_seconds = 600
    world.org.save(update_fields=["hold_window_seconds"])
    mark_node_alive(world.node)
    funded(2 * 1000 * 1000)  # 2 GPUs x 1,000 s: exactly the estimate
    submit(gpus=2, max_wall_seconds=1000)
    [attempt] = place_pending()
    report_started(node=world.node, attempt_id=attempt.pk)
    shift_started(attempt, 1000)
    hold = Hold.objects.get(pk=attempt.hold_id)
    for seq, seconds in enumerate((550, 700), start=1):  # each: below the look-ahead, extended by it
        ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, seq, 2 * seconds * 1000)])
        assert charge_progress(attempt=attempt).actions == (Action.CAPTURED, Action.EXTENDED)
    hold.refresh_from_db()
    left = 2 * 1000 * 1000 - (hold.captured + hold.remaining)
    # At the next charge, 150 s later, the look-ahead's shortfall is more than the org has left.
    assert 0 < left < lookahead_cost(attempt) - hold.remaining + 2 * 150 * 1000
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 3, 2 * 850 * 1000)])
    result = charge_progress(attempt=attempt)
    assert result.actions == (Action.CAPTURED, Action.EXTENDED)
    assert result.extended == left  # the rest of the run: all the org had left
    hold.refresh_from_db()
    assert hold.captured + hold.remaining == 2 * 1000 * 1000
    # Later charges ask only for the metering slack, are refused, and the run goes on to its wall.
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 4, 2 * 950 * 1000)])
    assert charge_progress(attempt=attempt).actions == (Action.CAPTURED,)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING


def test_a_preempted_windowed_run_is_paid_for_through_its_checkpoint_grace(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    """Review: the look-ahead counted an out-of-credit stop's grace (30 s), but a preemption or an
    eviction stops a run with the scheduler's checkpoint grace (120 s), and a stopping run's hold
    is not extended: preempted just before a charge, a windowed run outlived its hold and the rest
    was settled `unfunded` though its org had credits to spare. The look-ahead now counts the
    longest stop's grace."""
    from metering.reports import ExitReport, report_exit
    from scheduling.core import Config
    from scheduling.services.lifecycle import request_stop_many

    funded(100 * MICRO)
    attempt = running(world, submit, window=60)  # 2 GPUs, a windowed hold
    lookahead = lookahead_cost(attempt)
    hold = Hold.objects.get(pk=attempt.hold_id)
    used, seq = 0, 0
    for seconds in (70, 60, 60):  # steady state: each charge brings the hold back to the look-ahead
        used += 2 * seconds * 1000
        seq += 1
        ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, seq, used)])
        assert Action.EXTENDED in charge_progress(attempt=attempt).actions
        hold.refresh_from_db()
        assert hold.remaining >= lookahead
    used += 2 * 60 * 1000  # one charge interval later it is preempted, just before the next charge
    seq += 1
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, seq, used)])
    grace = int(Config().grace_seconds)
    request_stop_many(items=[(attempt.pk, grace)], reason="preempted")
    charge_progress(attempt=attempt)  # stopping: captures, never extends
    # The stop reaches the agent with its next heartbeat (30 s); the job checkpoints through its
    # grace, then exits and reports.
    used += 2 * (30 + grace) * 1000
    report_exit(node=world.node, attempt_id=attempt.pk,
                report=ExitReport(seq=seq + 1, cumulative_gpu_ms=used, outcome="preempted"))
    settled = AuditEvent.objects.get(action="metering.attempt_settled", subject_id=str(attempt.pk))
    assert (settled.data["billable_gpu_ms"], settled.data["unfunded"]) == (used, 0)


def _ten_minutes_charged_until(
    world: World, submit: Callable[..., Job], until: int, *, started_ago: int
) -> tuple[JobAttempt, int]:
    """A 1-GPU job of 600 s max wall, no hold window (its hold pays for the whole run), running,
    heartbeating and charged every minute up to `until` s; (attempt, last heartbeat seq)."""
    mark_node_alive(world.node)
    submit(gpus=1, max_wall_seconds=600)
    [attempt] = place_pending()
    report_started(node=world.node, attempt_id=attempt.pk)
    shift_started(attempt, started_ago)
    seq = 0
    for t in range(60, until + 1, 60):
        seq += 1
        ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, seq, t * 1000)])
        charge_progress(attempt=attempt)
    return attempt, seq


def test_a_run_killed_at_its_max_wall_by_its_agent_is_paid_for_through_the_grace(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    """Review: the agent kills a run at its max wall time plus the time-out grace (30 s, sent in
    each start), but `max_cost` stopped at the max wall time (+1 % + 5 s per GPU), so a short run
    that used its SIGTERM grace was billed past what its hold could be extended to, `unfunded`,
    its org able to pay."""
    from metering.reports import ExitReport, report_exit

    funded(100 * MICRO)
    attempt, seq = _ten_minutes_charged_until(world, submit, 600, started_ago=631)
    used = (600 + 30) * 1000  # SIGTERM at 600 s, SIGKILL 30 s later
    report_exit(node=world.node, attempt_id=attempt.pk,
                report=ExitReport(seq=seq + 1, cumulative_gpu_ms=used, outcome="timed_out", signal=9))
    settled = AuditEvent.objects.get(action="metering.attempt_settled", subject_id=str(attempt.pk))
    assert (settled.data["billable_gpu_ms"], settled.data["unfunded"]) == (used, 0)


def test_a_run_preempted_near_its_max_wall_is_paid_for_through_its_checkpoint_grace(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    """Review: `max_cost` counted the time-out grace (30 s) past the max wall time, but a
    preemption's checkpoint grace (120 s) begun 60 s before it runs the job 60 s past it: that was
    settled `unfunded` though its org could pay. It counts the longest stop's grace now."""
    from metering.reports import ExitReport, report_exit
    from scheduling.core import Config
    from scheduling.services.lifecycle import request_stop_many

    funded(100 * MICRO)
    attempt, seq = _ten_minutes_charged_until(world, submit, 540, started_ago=800)
    grace = int(Config().grace_seconds)
    request_stop_many(items=[(attempt.pk, grace)], reason="preempted")  # 60 s before its max wall
    charge_progress(attempt=attempt)  # stopping: captures, never extends
    used = (540 + grace) * 1000  # SIGTERM now, SIGKILL when the grace ends: 60 s past the max wall
    report_exit(node=world.node, attempt_id=attempt.pk,
                report=ExitReport(seq=seq + 1, cumulative_gpu_ms=used, outcome="preempted"))
    settled = AuditEvent.objects.get(action="metering.attempt_settled", subject_id=str(attempt.pk))
    assert (settled.data["billable_gpu_ms"], settled.data["unfunded"]) == (used, 0)
