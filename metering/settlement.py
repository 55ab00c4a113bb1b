"""Settlement: the final capture of an attempt's billable usage and the release of the rest.

Exactly once: the hold's state machine (`active -> settled`, conditional UPDATE under the hold's
row lock) decides; a second call finds the hold settled and returns it unchanged. The capture,
the release to the exact origin buckets (to `expiry` for an expired bucket), the budget counters,
the usage row's `settled_at` and the audit event all commit in one transaction.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from django.db import transaction
from django.db.models import Count, F, Max
from django.db.models.functions import Greatest

from audit.models import AuditEvent
from audit.services import record
from config import metrics
from config.clock import db_now
from ledger.locks import lock_hold
from ledger.models import Hold, HoldState
from ledger.retry import retry_on_conflict
from ledger.services import settle_hold
from metering.cost import MS_PER_HOUR, cost
from metering.models import AttemptUsage
from scheduling.models import Allocation, Job, JobAttempt

log = logging.getLogger(__name__)


def lock_usage(attempt: JobAttempt) -> AttemptUsage | None:
    """Lock the attempt's usage row (after the hold, per the lock order) and re-read it."""
    return AttemptUsage.objects.select_for_update().filter(attempt_id=attempt.pk).first()


def captured_gpu_ms_for(*, billable: int, captured: int, rate: int) -> int:
    """How much of `billable` the money `captured` pays for (never more than billable)."""
    if cost(billable, rate) <= captured:
        return billable
    # The largest usage whose cost fits in `captured`: ceil rounding means cost(ms) <= captured.
    return min(billable, captured * MS_PER_HOUR // rate) if rate else billable


def _budgets_for_settlement(hold: Hold, capture_total: int) -> tuple[int, int]:
    """Tell budgets what settle_hold is about to do (after the hold lock, before bucket locks)."""
    from budgets.services import record_capture, record_release

    to_capture = max(0, min(capture_total - hold.captured, hold.remaining))
    to_release = hold.remaining - to_capture
    if to_capture:
        record_capture(hold=hold, amount=to_capture)
    if to_release:
        record_release(hold=hold, amount=to_release)
    return to_capture, to_release


def gang_billable(attempt: JobAttempt, usage: AttemptUsage) -> int:
    """A gang's billable usage once its last part has ended: what it had billed when its first
    part ended (`gang_base_gpu_ms`, the longest part's time on every GPU), plus each part still
    running then, its GPUs for the whole seconds it ran on (to the earlier of its GPUs' release and
    its node's last report of it: a lost node's silence is not billed), by the server's clock; never
    beyond the cap of its whole run (elapsed x GPUs, the metering tolerance), never less than the
    heartbeats gave. The row is raised to it (review: after the first part exited, the others' own
    reports scaled to their own GPUs stayed below the gang's figure, so their last seconds went
    unbilled). Called under the hold and usage locks, after every part has been released."""
    from metering.heartbeats import billable_cap

    reports = usage.part_reports or {}
    base_at = usage.gang_base_at
    extra = 0
    parts = (Allocation.objects.filter(attempt_id=attempt.pk).values("node_id")
             .annotate(gpus=Count("pk"), released=Max("released_at")))
    for part in parts:
        # Seen running until its node's last report of it; one its node never reported is billed
        # nothing more (review: it was billed for its silence until a sweep ended it lost).
        seen = _parsed(reports.get(str(part["node_id"])))
        if part["released"] is None or seen is None:
            continue
        end = min(part["released"], seen)
        if end > base_at:
            extra += part["gpus"] * int((end - base_at).total_seconds()) * 1000
    started, ended = attempt.started_at, attempt.ended_at or db_now()
    cap = billable_cap((ended - started).total_seconds(), attempt.gpu_count) if started else 0
    billable = max(usage.billable_gpu_ms, min((usage.gang_base_gpu_ms or 0) + extra, cap))
    if billable > usage.billable_gpu_ms:
        AttemptUsage.objects.filter(pk=usage.pk).update(
            billable_gpu_ms=billable, reported_gpu_ms=Greatest(F("reported_gpu_ms"), billable))
    return billable


def _parsed(value: object) -> datetime | None:
    """A part report's time (ISO 8601, as the heartbeat statement or the portable path wrote it)."""
    if not isinstance(value, str):
        return None
    moment = datetime.fromisoformat(value)
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _fund_overrun(attempt: JobAttempt, hold: Hold, due: int) -> int:
    """Extend the hold by what the run used beyond it, as far as its org can pay (funds and
    budgets, as a charge tick's extension): the most an attempt can bill is its max wall time
    plus the longest stop grace (`charging.max_cost`), and a run that ends between two charge ticks
    was never extended for the overrun (QA: a 10 s job that ignored SIGTERM ran 41 s and paid for
    10, while one whose run spanned a tick paid for all of it). When the whole overrun is refused,
    the most the org can pay, to within 1 % of it (QA: all or nothing, an org short of the whole
    paid none of it). Returns the amount extended."""
    from metering.charging import lock_ahead_for_extension, max_cost, pays_for, try_extend

    job = Job.objects.only("max_wall_seconds").get(pk=attempt.job_id)
    shortfall = min(due, max_cost(attempt, job)) - pays_for(hold)
    if shortfall <= 0:
        return 0
    # The extension and the settlement after it: periods and buckets at once, in lock order (review:
    # a period after buckets across a month's end, a lower bucket after a higher, an alert's audit
    # head before buckets: deadlocks).
    lock_ahead_for_extension(hold)
    why = "overrun at settlement"
    if not try_extend(attempt, hold, shortfall, why=why):
        return shortfall
    payable = _most_payable(attempt, hold, shortfall)
    if not payable:
        return 0
    refusal = try_extend(attempt, hold, payable, why=why)
    if refusal:  # the trial just granted it under the same locks: never expected (review)
        log.warning("attempt %s: extension of %s refused after a trial granted it: %s", attempt.pk, payable,
                    refusal)
        return 0
    return payable


class _Probe(Exception):
    """Rolls a trial extension back."""


def _most_payable(attempt: JobAttempt, hold: Hold, refused: int) -> int:
    """The largest extension below `refused` that funds and budgets allow, to within 1 % of it:
    bisection over trial extensions, each rolled back (a savepoint), under the locks taken ahead."""
    from metering.charging import try_extend

    types = list(hold.gpu_types)
    lo, hi, step = 0, refused, max(1, refused // 100)
    while hi - lo > step:
        mid = (lo + hi) // 2
        try:
            with transaction.atomic():
                refusal = try_extend(attempt, hold, mid)
                hold.gpu_types = list(types)  # a trial that narrowed the hold's types is undone
                if not refusal:
                    raise _Probe
            hi = mid
        except _Probe:
            lo = mid
    return lo


@retry_on_conflict()
@transaction.atomic
def settle_attempt(*, attempt: JobAttempt, outcome: str) -> Hold:
    """Capture cost(billable usage) at the attempt's fixed rate and release the rest of its hold.

    Called by `lifecycle.finish_attempt` (inside its transaction, after the attempt is ended) and by
    the stranded-hold sweep. Billable usage is whatever the heartbeats (and the exit report, applied
    just before) left on the usage row: for a lost node that is the last known usage.
    """
    hold = lock_hold(attempt.hold_id)
    if hold.state != HoldState.ACTIVE:
        return hold  # settled before: exactly once
    usage = lock_usage(attempt)
    billable = usage.billable_gpu_ms if usage is not None else 0
    if usage is not None and usage.gang_base_at is not None:
        billable = gang_billable(attempt, usage)
    rate = attempt.rate_per_gpu_hour
    due = cost(billable, rate)
    extended = _fund_overrun(attempt, hold, due)
    if extended:
        hold = lock_hold(hold.pk)
    # Never beyond the hold (no overspend); what the hold cannot cover is recorded, not charged.
    capture_total = min(due, hold.captured + hold.remaining)
    before_captured, authorized = hold.captured, hold.authorized
    to_capture, to_release = _budgets_for_settlement(hold, capture_total)
    # Named as the API names it (QA: the internal attempt id read like another org's job).
    reason = f"job {attempt.job_id} attempt {attempt.number} {outcome}"
    hold = settle_hold(hold=hold, capture_total=capture_total, reason=reason)
    now = db_now()
    metrics.attempt_settled(attempt=attempt, outcome=outcome, captured=to_capture, settled_at=now)
    if usage is not None:
        AttemptUsage.objects.filter(pk=usage.pk).update(
            settled_at=now,
            captured_gpu_ms=captured_gpu_ms_for(billable=billable, captured=capture_total, rate=rate),
        )
    else:
        AttemptUsage.objects.bulk_create(
            [AttemptUsage(attempt_id=attempt.pk, org_id=attempt.org_id, settled_at=now)],
            ignore_conflicts=True,
        )
    record(
        action="metering.attempt_settled",
        subject_type="attempt",
        subject_id=attempt.pk,
        org_id=attempt.org_id,
        actor_type=AuditEvent.ActorType.SYSTEM,
        amount=capture_total,
        reason_code=outcome,
        data={
            "job": attempt.job_id,
            "hold": hold.pk,
            "billable_gpu_ms": billable,
            "rate_per_gpu_hour": rate,
            "authorized": authorized,
            "captured_before": before_captured,
            "captured_now": to_capture,
            "released": to_release,
            "extended_at_settlement": extended,
            "unfunded": due - capture_total,
        },
    )
    return hold
