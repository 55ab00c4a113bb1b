"""Write one pass's decisions in the caller's transaction: bulk inserts, one query per table.

Place -> JobAttempt (rate fixed at the placed type's current price, on the job's current hold),
Allocation rows (the partial unique index forbids a GPU twice: a job whose GPUs were taken meanwhile
is skipped this pass), an AttemptUsage row, job queued -> scheduled, and the hold's excess released
when the placed type is cheaper than the hold assumed (or, when it is dearer, the hold topped up
first: `repricing`). Preempt -> `lifecycle.request_stop` with the
core's grace. Skip -> the job's wait reason, updated (and audited) only when it changed.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F

from audit.models import AuditEvent
from audit.services import NewEvent, record_many
from config.clock import aware_row
from config.errors import DomainError
from ledger.models import Hold
from metering.models import AttemptUsage
from scheduling import core
from scheduling.adapter.repricing import (
    dearer_preemptors,
    has_excess,
    lock_ledger_ahead,
    placed_cost,
    top_up_dearer,
)
from scheduling.adapter.snapshot import Loaded, PendingRow
from scheduling.core import reasons as core_reasons
from scheduling.models import (
    DETAIL_MAX_LENGTH,
    Allocation,
    AttemptState,
    Job,
    JobAttempt,
    JobState,
    Node,
    NodeCordon,
    NodeState,
)
from scheduling.services.lifecycle import can_transition, request_stop_many

log = logging.getLogger("scheduling.adapter")
assert can_transition(JobState.QUEUED, JobState.SCHEDULED)  # the bulk path below relies on it


def _event(**fields: Any) -> NewEvent:
    return NewEvent(actor_type=AuditEvent.ActorType.SCHEDULER, **fields)


@dataclass(slots=True)
class Applied:
    """What the writer did (counts go to the SchedulerPass row)."""

    placed: list[int] = field(default_factory=list)
    backfilled: int = 0
    preempted: int = 0
    reasons_changed: int = 0
    conflicts: list[int] = field(default_factory=list)
    excess_released: int = 0
    events: int = 0


def _attempt_for(place: core.Place, row: PendingRow, number: int, loaded: Loaded) -> JobAttempt:
    return JobAttempt(
        job_id=place.job_id,
        number=number,
        org_id=row.org_id,
        state=AttemptState.SCHEDULED,
        gpu_type_id=loaded.type_ids[place.gpu_type],
        gpu_count=sum(len(idx) for _, idx in place.allocations),
        node_count=len({node_id for node_id, _ in place.allocations}),
        rate_per_gpu_hour=place.rate_micro_per_gpu_hour,
        hold_id=row.hold_id,
        scheduled_at=loaded.now,
        backfilled=place.backfilled,
    )


def _allocations_for(attempt: JobAttempt, place: core.Place, loaded: Loaded) -> list[Allocation]:
    return [
        Allocation(attempt_id=attempt.pk, node_id=node_id, gpu_index=i, allocated_at=loaded.now)
        for node_id, indices in place.allocations
        for i in indices
    ]


def _insert_placements(
    places: list[core.Place], loaded: Loaded, numbers: dict[int, int]
) -> tuple[list[tuple[core.Place, JobAttempt]], list[int]]:
    """Bulk insert attempts + allocations; on a conflict, redo job by job to skip only the losers."""
    attempts = [_attempt_for(p, loaded.pending[p.job_id], numbers[p.job_id], loaded) for p in places]
    try:
        with transaction.atomic():
            JobAttempt.objects.bulk_create(attempts, batch_size=2000)
            Allocation.objects.bulk_create(
                [a for p, at in zip(places, attempts, strict=True) for a in _allocations_for(at, p, loaded)],
                batch_size=5000,
            )
        return list(zip(places, attempts, strict=True)), []
    except IntegrityError:
        log.warning("allocation conflict in a bulk placement; retrying job by job")
    done: list[tuple[core.Place, JobAttempt]] = []
    conflicts: list[int] = []
    for place in places:
        attempt = _attempt_for(place, loaded.pending[place.job_id], numbers[place.job_id], loaded)
        try:
            with transaction.atomic():
                attempt.save(force_insert=True)
                Allocation.objects.bulk_create(_allocations_for(attempt, place, loaded))
        except IntegrityError:
            conflicts.append(place.job_id)
            continue
        done.append((place, attempt))
    return done, conflicts


def release_excess(*, job_id: int, attempt: JobAttempt, row: PendingRow, gpu_type: str) -> int:
    """Release what the hold holds beyond the placed type's cost for the hold's window."""
    from budgets.services import record_release
    from ledger.locks import lock_hold
    from ledger.models import HoldState
    from ledger.services import release_partial

    hold = lock_hold(attempt.hold_id)
    if hold.state != HoldState.ACTIVE:
        return 0
    excess = _excess(hold, attempt, row)
    if excess <= 0:
        return 0
    record_release(hold=hold, amount=excess)
    release_partial(hold=hold, amount=excess, key=f"job:{job_id}:attempt:{attempt.number}:excess")
    return excess


def _nodes_in_service(node_ids: set[int]) -> dict[int, tuple[Any, Any]]:
    """Those of `node_ids` still ready and not cordoned, with their maintenance window (start, end).
    On PostgreSQL the rows are locked FOR KEY SHARE: a cordon (`nodes.set_cordon`, FOR UPDATE) or
    a window (the node admin, FOR UPDATE) committed since the snapshot is seen here, and one that
    comes later waits for this pass, whose attempts its eviction then finds. Heartbeats (plain
    UPDATEs of non-key columns) do not wait for it."""
    if not node_ids:
        return {}
    table = Node._meta.db_table
    lock = " FOR KEY SHARE" if connection.vendor == "postgresql" else ""  # SQLite: one writer at a time
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, maintenance_from, maintenance_until FROM {table} "  # noqa: S608
            f"WHERE id IN ({', '.join(['%s'] * len(node_ids))}) "
            f"AND state = %s AND cordon = %s ORDER BY id{lock}",
            [*sorted(node_ids), NodeState.READY, NodeCordon.NONE],
        )
        rows = [aware_row(row) for row in cursor.fetchall()]
    return {row[0]: (row[1], row[2]) for row in rows}


def _clear_of_windows(place: core.Place, usable: dict[int, tuple[Any, Any]], now: datetime) -> bool:
    """Whether the run (now .. now + its max wall) misses every maintenance window of its nodes
    as they are now (one may have been set since the snapshot)."""
    end = now + timedelta(seconds=place.max_wall_seconds)
    for node_id, _ in place.allocations:
        start, until = usable[node_id]
        if start is not None and start < end and until > now:
            return False
    return True


def _place(
    loaded: Loaded, places: list[core.Place], applied: Applied, events: list[NewEvent],
    preempts: list[core.Preempt], preempting: list[core.Place],
) -> set[int]:
    """Make the placements; first top up the holds of placements, and of preemptors (`preempting`:
    their runs as they would be placed), that cost more than the hold holds. Returns the
    preemptors whose run is not funded, or which are no longer queued (held or cancelled since
    the snapshot): their victims are not signalled (review: a top-up refused at placement had
    stopped them for nothing).

    Every job this pass touches is locked first, in one query in id order: placed jobs,
    preemptors and the victims' jobs (review: the victims' were locked after the top-ups' holds,
    budgets and buckets, against the order their charging takes: job, attempt, hold, budgets)."""
    preemptors = {d.for_job_id for d in preempts}
    if not places and not preempts:
        return set()
    rows = (
        Job.objects.select_for_update(of=("self",))
        .filter(pk__in={p.job_id for p in places} | preemptors | {d.job_id for d in preempts})
        .order_by("pk")
        .values_list("id", "attempt_count", "state", "held", "current_hold_id")
    )
    # Still queued with a hold and not held by their user since the snapshot was read.
    locked = {job_id: count + 1 for job_id, count, state, held, hold_id in rows
              if state == JobState.QUEUED and hold_id is not None and not held}
    unfunded = preemptors - set(locked)
    usable = _nodes_in_service({n for p in places if p.job_id in locked for n, _ in p.allocations})
    numbers = {p.job_id: locked[p.job_id] for p in places
               if p.job_id in locked and all(n in usable for n, _ in p.allocations)
               and _clear_of_windows(p, usable, loaded.now)}
    applied.conflicts.extend(p.job_id for p in places if p.job_id not in numbers)
    placing = [p for p in places if p.job_id in numbers]
    funding = placing + [p for p in preempting if p.job_id in locked]
    lock_ledger_ahead(loaded, funding, placing)
    funded = top_up_dearer(loaded, funding, events)
    unfunded |= {p.job_id for p in preempting} - {p.job_id for p in funded}
    funded = [p for p in funded if p.job_id in numbers]
    if not funded:
        return unfunded
    done, conflicts = _insert_placements(funded, loaded, numbers)
    applied.conflicts.extend(conflicts)
    if not done:
        return unfunded
    AttemptUsage.objects.bulk_create(
        [AttemptUsage(attempt_id=a.pk, org_id=a.org_id) for _, a in done], batch_size=5000
    )
    ids = [p.job_id for p, _ in done]
    Job.objects.filter(pk__in=ids, state=JobState.QUEUED).update(
        state=JobState.SCHEDULED, attempt_count=F("attempt_count") + 1, wait_reason="",
        wait_detail="", expected_start_at=None, not_before=None, price_capped_until=None,
        updated_at=loaded.now,
    )
    cheaper: list[tuple[int, JobAttempt, PendingRow]] = []
    for place, attempt in done:
        row = loaded.pending[place.job_id]
        applied.placed.append(place.job_id)
        applied.backfilled += place.backfilled
        events.append(_event(
            action="sched.place", subject_type="job", subject_id=place.job_id, org_id=row.org_id,
            reason_code=place.reason_code,
            data={"from": JobState.QUEUED, "to": JobState.SCHEDULED, "attempt": attempt.number,
                  "attempt_id": attempt.pk, "gpu_type": place.gpu_type,
                  "gpus": [[n, list(idx)] for n, idx in place.allocations],
                  "rate": place.rate_micro_per_gpu_hour, "backfilled": place.backfilled},
        ))
        # An excess only where the hold holds more than the run needs (a cheaper type, or a price
        # that fell after a top-up: review), as the snapshot saw it; re-read under the hold's lock.
        if has_excess(loaded, place):
            cheaper.append((place.job_id, attempt, row))
    applied.excess_released += _release_excess_many(cheaper)
    return unfunded


def _excess(hold: Hold, attempt: JobAttempt, row: PendingRow) -> int:
    return hold.remaining - placed_cost(row, attempt.gpu_count, attempt.rate_per_gpu_hour)


def _release_excess_many(cheaper: list[tuple[int, JobAttempt, PendingRow]]) -> int:
    """Release the excess holds of all cheaper placements in one batch ledger call (holds locked
    by id, then budgets per hold, then every affected bucket by id); if the batch is refused,
    fall back to job by job so one bad hold does not keep the others' excess held."""
    from budgets.services import record_release_many
    from ledger.locks import lock_holds
    from ledger.models import HoldState
    from ledger.services import release_partial_many

    if not cheaper:
        return 0
    holds = {h.pk: h for h in lock_holds(a.hold_id for _, a, _ in cheaper)}
    items: list[tuple[Hold, int, str]] = []
    for job_id, attempt, row in cheaper:
        hold = holds.get(attempt.hold_id)
        if hold is None or hold.state != HoldState.ACTIVE:
            continue
        excess = _excess(hold, attempt, row)
        if excess > 0:
            items.append((hold, excess, f"job:{job_id}:attempt:{attempt.number}:excess"))
    if len({h.pk for h, _, _ in items}) == len(items):
        try:
            with transaction.atomic():
                record_release_many(items=[(hold, excess) for hold, excess, _ in items])
                release_partial_many(items=items)
            return sum(excess for _, excess, _ in items)
        except DomainError:
            log.exception("batch release of excess holds refused; releasing job by job")
    released = 0
    for job_id, attempt, row in cheaper:
        try:
            with transaction.atomic():
                released += release_excess(job_id=job_id, attempt=attempt, row=row, gpu_type="")
        except DomainError:
            log.exception("could not release the excess hold of job %s", job_id)
    return released


def _preempt(loaded: Loaded, preempts: list[core.Preempt], applied: Applied,
             events: list[NewEvent]) -> None:
    stopped = request_stop_many(
        items=[(d.attempt_id, d.grace_seconds) for d in preempts], reason="preempted"
    )
    for decision in preempts:
        attempt = stopped.get(decision.attempt_id)
        if attempt is None or attempt.stop_reason != "preempted":
            continue  # gone, ended meanwhile, or a cancellation got there first
        applied.preempted += 1
        events.append(_event(
            action="sched.preempt", subject_type="job", subject_id=decision.job_id,
            org_id=loaded.attempt_orgs.get(decision.attempt_id), reason_code=decision.reason_code,
            data={"attempt_id": decision.attempt_id, "for_job": decision.for_job_id,
                  "grace_seconds": attempt.grace_seconds},
        ))


def _expected_starts(reservations: list[core.Reservation]) -> dict[int, datetime]:
    """Job id -> the earliest start a reservation of this pass expects for it, rounded up to the
    second: a "by" bound that every view shows alike (QA: the portal cut the seconds off, showing
    a time before the reservation's)."""
    starts: dict[int, float] = {}
    for res in reservations:
        if res.start_at < starts.get(res.job_id, float("inf")):
            starts[res.job_id] = res.start_at
    return {job_id: datetime.fromtimestamp(math.ceil(at), UTC) for job_id, at in starts.items()}


def _skip(
    loaded: Loaded, result: core.Result, applied: Applied, events: list[NewEvent], leave: set[int],
) -> None:
    """Write the wait reasons that changed; `leave`: jobs told why already (an unfunded preemptor)."""
    # (job id, reason, detail, expected start): no model instances for 10k rows
    changed: list[tuple[int, str, str, datetime | None]] = []
    starts = _expected_starts(result.reservations)
    for skip in result.skips:
        row = loaded.pending.get(skip.job_id)
        if row is None or skip.job_id in leave:
            continue
        detail = skip.detail[:DETAIL_MAX_LENGTH]
        if skip.reason_code == row.wait_reason == core_reasons.BUDGET and row.wait_detail:
            detail = row.wait_detail  # the refusal's own words (lifecycle.fund_job), not the core's
        start = starts.get(skip.job_id)
        if (row.wait_reason, row.wait_detail, row.expected_start_at) == (skip.reason_code, detail, start):
            continue
        changed.append((skip.job_id, skip.reason_code, detail, start))
        if row.wait_reason != skip.reason_code:
            events.append(_event(
                action="sched.skip", subject_type="job", subject_id=skip.job_id, org_id=row.org_id,
                reason_code=skip.reason_code, data={"detail": detail, "previous": row.wait_reason},
            ))
    for job in loaded.not_granted:
        if (job.wait_reason, job.wait_detail) == (core_reasons.CLASS_NOT_GRANTED, job.detail):
            continue
        changed.append((job.job_id, core_reasons.CLASS_NOT_GRANTED, job.detail, None))
        events.append(_event(
            action="sched.skip", subject_type="job", subject_id=job.job_id, org_id=job.org_id,
            reason_code=core_reasons.CLASS_NOT_GRANTED,
            data={"detail": job.detail, "previous": job.wait_reason},
        ))
    if changed:
        _write_wait_reasons(changed)
    applied.reasons_changed = len(changed)


def _write_wait_reasons(changed: list[tuple[int, str, str, datetime | None]]) -> None:
    """One UPDATE for all changed wait reasons and expected starts; only jobs still queued and not
    held (a cancelled one keeps its cleared reason, a held one `held`). PostgreSQL joins arrays
    (bulk_update's CASE is quadratic at this size)."""
    if connection.vendor != "postgresql":
        Job.objects.filter(state=JobState.QUEUED, held=False).bulk_update(
            [Job(pk=i, wait_reason=r, wait_detail=d, expected_start_at=s) for i, r, d, s in changed],
            ["wait_reason", "wait_detail", "expected_start_at"], batch_size=500,
        )
        return
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS j SET wait_reason = v.reason, wait_detail = v.detail, "  # noqa: S608
            "expected_start_at = v.start "
            "FROM json_to_recordset(%s::json) AS v(id bigint, reason text, detail text, start timestamptz) "
            "WHERE j.id = v.id AND j.state = %s AND NOT j.held",
            # One JSON parameter: quoting 10k-element arrays client-side costs more than the UPDATE.
            [json.dumps([{"id": i, "reason": r, "detail": d, "start": s.isoformat() if s else None}
                         for i, r, d, s in changed]),
             JobState.QUEUED],
        )


def apply_result(*, loaded: Loaded, result: core.Result) -> Applied:
    """Apply `result` inside the caller's transaction (which holds the leader lock)."""
    applied = Applied()
    events: list[NewEvent] = []
    unfunded = _place(loaded, result.placements, applied, events, result.preemptions,
                      dearer_preemptors(loaded, result))
    _preempt(loaded, [d for d in result.preemptions if d.for_job_id not in unfunded], applied, events)
    _skip(loaded, result, applied, events, leave=unfunded)
    applied.events = record_many(events)
    return applied
