"""A placement on a type dearer than the job's hold was priced for: top the hold up first.

A hold is priced at submission (or requeue) at the dearest acceptable type's price then. If a price
rises before the job is placed, the run's rate (the placed type's current price, fixed for the run)
is more than the hold covers. Placing it anyway would bill usage the hold cannot capture: a short
run could end before the periodic charge extends the hold, and the settlement would write the rest
off as unfunded. So before such a placement the hold is extended by the difference for the hold's
window, with every budget level checked, in a savepoint. If that is refused the job is not placed
there: it waits with reason `budget` and a detail that says why, and for the next
`SCHEDULER_FUNDING_RETRY_SECONDS` (`Job.price_capped_until`) the scheduler places it only on the
types its hold covers (`PendingJob.max_price`); after that a dearer type is tried again. So a job
whose hold covers a type that is free runs there at once, and one whose hold covers none waits
`budget` (review: waiting for the retry while a covered type sat free starved it).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from django.db import transaction

from audit.models import AuditEvent
from audit.services import NewEvent
from config.errors import DomainError
from ledger.money import format_credits
from metering.conf import window_floor_seconds
from metering.cost import cost
from scheduling import core
from scheduling.core import reasons
from scheduling.models import DETAIL_MAX_LENGTH, Job, JobState
from scheduling.pricing import held_gpu_ms, held_seconds
from scheduling.services.lifecycle import funding_retry_at

if TYPE_CHECKING:
    from scheduling.adapter.snapshot import Loaded, PendingRow

log = logging.getLogger("scheduling.adapter")


def placed_cost(row: PendingRow, gpus: int, rate: int) -> int:
    """Cost of the hold's window (max wall time, or the org's shorter hold window) at `rate`."""
    return cost(held_gpu_ms(gpus, row.max_wall_seconds, row.hold_window_seconds), rate)


def _gpus(place: core.Place) -> int:
    return sum(len(idx) for _, idx in place.allocations)


def _below_window_floor(row: PendingRow, place: core.Place, remaining: int) -> bool:
    """Whether the hold would pay for the run at its rate over the org's window as typed, so that
    what it lacks is only the look-ahead floor (`pricing.held_seconds`): a hold placed before
    windowed holds were floored (review: it was topped up as "price-rose" and, when refused,
    told a price had risen that had not)."""
    window = row.hold_window_seconds
    if not window or window >= row.max_wall_seconds:
        return False
    return cost(_gpus(place) * window * 1000, place.rate_micro_per_gpu_hour) <= remaining


def _why_more(row: PendingRow, place: core.Place, remaining: int) -> tuple[str, str]:
    """(reason code, words) for a run that costs more than its hold holds."""
    if _below_window_floor(row, place, remaining):
        held = held_seconds(row.max_wall_seconds, row.hold_window_seconds)
        return "window-floor", (
            f"the hold pays for the org's {row.hold_window_seconds} s hold window; this job's must pay "
            f"for {held} s (a windowed hold covers at least the metering look-ahead, "
            f"{window_floor_seconds()} s, or the whole max wall time when shorter)"
        )
    return "price-rose", (
        f"{place.gpu_type} now costs {format_credits(place.rate_micro_per_gpu_hour)} credits per GPU-hour, "
        "more than the hold was priced at"
    )


def dearer_preemptors(loaded: Loaded, result: core.Result) -> list[core.Place]:
    """The runs that this pass's new preemptions make room for, as the placements they will be,
    where they cost more than the preemptor's hold holds: the writer tops those holds up before it
    signals any victim, and signals none for a run it cannot fund."""
    preemptors = {d.for_job_id for d in result.preemptions}
    prices = loaded.snapshot.gpu_types
    runs = []
    for res in result.reservations:
        row = loaded.pending.get(res.job_id)
        if res.kind != "preemption" or res.job_id not in preemptors or row is None:
            continue
        rate = prices[res.gpu_type].price_per_gpu_hour_micro
        run = core.Place(res.job_id, res.gpu_type, res.allocations, False, reasons.PLACED, rate,
                         float(row.max_wall_seconds))
        if placed_cost(row, _gpus(run), rate) > row.hold_remaining:
            runs.append(run)
    return runs


def _dearer(loaded: Loaded, place: core.Place) -> bool:
    row = loaded.pending[place.job_id]
    return placed_cost(row, _gpus(place), place.rate_micro_per_gpu_hour) > row.hold_remaining


def has_excess(loaded: Loaded, place: core.Place) -> bool:
    """Whether the job's hold (as the snapshot saw it) holds more than the placed run needs."""
    row = loaded.pending[place.job_id]
    return placed_cost(row, _gpus(place), place.rate_micro_per_gpu_hour) < row.hold_remaining


def lock_ledger_ahead(loaded: Loaded, funding: list[core.Place], placing: list[core.Place]) -> None:
    """Take every ledger lock the pass's top-ups (of `funding`) and excess releases (of `placing`)
    can need before any of them, each kind at once and in its order: holds by id, budget periods,
    buckets by id. Topping up or releasing hold by hold, the pass locked a later hold's budget
    periods, or a bucket of a lower id, after an earlier hold's buckets, against the order a
    submission, a charge or a cancel takes: a deadlock with any of them (review). The caller holds
    the jobs' locks; the later per-hold locks find these rows already held."""
    from budgets.services import lock_periods_ahead
    from ledger.locks import lock_buckets_ahead, lock_holds

    up = {loaded.pending[p.job_id].hold_id for p in funding if _dearer(loaded, p)}
    down = {loaded.pending[p.job_id].hold_id for p in placing if has_excess(loaded, p)}
    holds = lock_holds(h for h in up | down if h is not None)
    if not holds:
        return
    extending, releasing = [h for h in holds if h.pk in up], [h for h in holds if h.pk in down]
    lock_periods_ahead(extending=extending, releasing=releasing)
    lock_buckets_ahead(extending_orgs={h.org_id for h in extending}, releasing=[h.pk for h in releasing])


def top_up_dearer(loaded: Loaded, places: list[core.Place], events: list[NewEvent]) -> list[core.Place]:
    """Extend the holds of placements that cost more than their hold holds; returns the places to
    make (the refused ones are dropped and their jobs told why). The caller holds the jobs' locks
    and has taken the ledger's (`lock_ledger_ahead`)."""
    dearer = [p for p in places if _dearer(loaded, p)]
    if not dearer:
        return places
    refused: set[int] = set()
    for place in dearer:
        row = loaded.pending[place.job_id]
        detail = _top_up(place, row, events)
        if detail:
            refused.add(place.job_id)
            _wait_for_funds(loaded, place, row, detail, events)
    return [p for p in places if p.job_id not in refused]


def _top_up(place: core.Place, row: PendingRow, events: list[NewEvent]) -> str:
    """Extend the hold by what the placed rate needs beyond what it holds; "" or the refusal."""
    from budgets.services import record_extension
    from ledger.locks import lock_hold
    from ledger.models import HoldState
    from ledger.services import extend_hold

    assert row.hold_id is not None  # the writer only places jobs that have a hold
    hold = lock_hold(row.hold_id)
    need = placed_cost(row, _gpus(place), place.rate_micro_per_gpu_hour) - hold.remaining
    if need <= 0:
        return ""  # the snapshot's figure was stale: the hold covers the run after all
    if hold.state != HoldState.ACTIVE:
        return f"hold {hold.pk} is {hold.state}"
    why = _why_more(row, place, hold.remaining)[0]
    key = f"job:{place.job_id}:attempt:{row.attempt_count + 1}:reprice:{hold.authorized}"
    try:
        with transaction.atomic():  # a refusal must leave the pass's transaction usable
            record_extension(hold=hold, amount=need)
            # Placed on one type: credits restricted to it may fund the top-up (the hold is then
            # narrowed to it, and the job runs only there should this placement not be made).
            extend_hold(hold=hold, amount=need, key=key, run_type=place.gpu_type,
                        reason=f"job {place.job_id} top-up for {place.gpu_type}")
    except DomainError as refusal:
        return f"topping the hold up by {format_credits(need)} credits was refused: {refusal.detail}"
    # The run's rate is fixed at placement: its estimate is now its max wall time at that rate.
    estimate = cost(_gpus(place) * row.max_wall_seconds * 1000, place.rate_micro_per_gpu_hour)
    Job.objects.filter(pk=place.job_id).update(estimate=estimate)
    events.append(NewEvent(
        actor_type=AuditEvent.ActorType.SCHEDULER, action="sched.hold.top_up", subject_type="job",
        subject_id=place.job_id, org_id=row.org_id, reason_code=why,
        data={"hold": hold.pk, "amount": need, "gpu_type": place.gpu_type,
              "rate": place.rate_micro_per_gpu_hour},
    ))
    return ""


def _wait_for_funds(
    loaded: Loaded, place: core.Place, row: PendingRow, refusal: str, events: list[NewEvent]
) -> None:
    retry = funding_retry_at(loaded.now)
    detail = f"{_why_more(row, place, row.hold_remaining)[1]}; {refusal}"[:DETAIL_MAX_LENGTH]
    log.info("job %s not placed: %s", place.job_id, detail)
    Job.objects.filter(pk=place.job_id, state=JobState.QUEUED).update(
        wait_reason=reasons.BUDGET, wait_detail=detail, price_capped_until=retry, expected_start_at=None
    )
    events.append(NewEvent(
        actor_type=AuditEvent.ActorType.SCHEDULER, action="sched.skip", subject_type="job",
        subject_id=place.job_id, org_id=row.org_id, reason_code=reasons.BUDGET,
        data={"detail": detail, "previous": row.wait_reason},
    ))
