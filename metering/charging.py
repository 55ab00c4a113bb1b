"""Usage to money while an attempt runs: progress captures, hold extensions, out-of-credit stops.

Runs periodically (Celery beat), never on the heartbeat path. Each charge is
`cost(billable now) - cost(already captured)`, keyed by the cumulative total, so a repeated or
concurrent run captures nothing twice. When what is left on the hold would not cover the next
look-ahead window, the hold is extended by one window (DESIGN.md §4: renewed window by window), or
back up to the look-ahead if a window is less, if funds and budgets allow; when they do not allow
a whole window, by the least that covers the look-ahead; otherwise the attempt is stopped
gracefully with reason `out_of_credit` and settled when it exits (or by the node sweep if it never
reports), unless its hold already pays for its whole max wall time (`covers_whole_run`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from django.db import transaction

from audit.models import AuditEvent
from audit.services import record
from config import metrics
from config.errors import DomainError
from ledger.locks import lock_hold
from ledger.models import Hold, HoldState
from ledger.money import format_credits
from ledger.retry import retry_on_conflict
from ledger.services import capture, extend_hold
from metering import conf
from metering.cost import cost
from metering.models import AttemptUsage
from metering.settlement import captured_gpu_ms_for, lock_usage
from scheduling.models import AttemptState, GpuType, Job, JobAttempt


class Action(enum.StrEnum):
    NOTHING = "nothing"
    CAPTURED = "captured"
    EXTENDED = "extended"
    STOPPED = "out_of_credit"


@dataclass(frozen=True)
class ChargeResult:
    """What one charge_progress run did for one attempt."""

    captured: int = 0
    extended: int = 0
    actions: tuple[Action, ...] = ()


def _window_ms(attempt: JobAttempt, seconds: float) -> int:
    ratio = conf.value("METERING_CAP_TOLERANCE_RATIO")
    return int(seconds * 1000 * attempt.gpu_count * (1 + ratio))


def lookahead_cost(attempt: JobAttempt) -> int:
    """Cost of what the attempt may use before the next run can react: two charge intervals, one
    heartbeat interval and the longest grace any stop gives a run (`conf.longest_stop_grace`: the
    stop is graceful, so it still runs then)."""
    return cost(_window_ms(attempt, conf.lookahead_seconds()), attempt.rate_per_gpu_hour)


def max_cost(attempt: JobAttempt, job: Job) -> int:
    """The most the attempt can ever bill: the billable cap when its agent kills it, at its max
    wall time plus the longest grace a stop gives (the time-out grace at the max wall time, or a
    preemption's checkpoint grace begun just before it). Review: capped at the max wall time, a
    run that used its SIGTERM grace was billed past its hold, unfunded, though its org could pay;
    then capped at the time-out grace, a run preempted in its last minutes the same."""
    slack = conf.seconds("METERING_CAP_SLACK_MS_PER_GPU") * attempt.gpu_count
    wall = job.max_wall_seconds + conf.longest_stop_grace()
    return cost(_window_ms(attempt, wall) + slack, attempt.rate_per_gpu_hour)


def pays_for(hold: Hold) -> int:
    """What the hold pays for: what it captured and still holds. Not `authorized`, which also counts
    what was given back at placement (a cheaper type; review: capping extensions by it never
    extended such a hold, and a windowed run went half unpaid)."""
    return hold.captured + hold.remaining


def covers_whole_run(attempt: JobAttempt, job: Job, hold: Hold) -> bool:
    """Whether the hold (what it captured and still holds) pays for the run's whole max wall time
    on its GPUs at its rate: the agent stops the run there, so an extension refused then was only
    for the metering tolerance beyond it (`max_cost`), and the run is not stopped for it. QA: a
    job whose hold covered its run (a short one, or one in its last minutes) was stopped
    `out_of_credit` when its org had nothing spare, funds or budget."""
    return pays_for(hold) >= run_cost(attempt, job)


def run_cost(attempt: JobAttempt, job: Job) -> int:
    """The run's whole max wall time on its GPUs at its rate (the job's estimate at that rate)."""
    return cost(job.max_wall_seconds * 1000 * attempt.gpu_count, attempt.rate_per_gpu_hour)


def extension_amount(attempt: JobAttempt, job: Job, hold: Hold, lookahead: int) -> int:
    """One hold window's cost (org policy, else the default window), or what brings the hold back
    up to the look-ahead when that is more; never beyond `max_cost`.

    A window may be shorter than the look-ahead (an org's is at least 60 s, one charge interval;
    the look-ahead is 2 charge intervals + a heartbeat + the stop's grace): one window per charge
    would then only just keep pace with usage, never rebuild the margin a refused extension's
    graceful stop runs on, and any late charge would leave usage past the hold (unfunded)."""
    window = job.org.hold_window_seconds or conf.seconds("METERING_EXTENSION_WINDOW_S")
    wanted = max(cost(_window_ms(attempt, window), attempt.rate_per_gpu_hour), lookahead - hold.remaining)
    return max(0, min(wanted, max_cost(attempt, job) - pays_for(hold)))


def _capture_progress(attempt: JobAttempt, hold: Hold, usage: AttemptUsage) -> int:
    from budgets.services import record_capture

    due = cost(usage.billable_gpu_ms, attempt.rate_per_gpu_hour)
    delta = min(due - hold.captured, hold.remaining)
    if delta <= 0:
        return 0
    total = hold.captured + delta
    record_capture(hold=hold, amount=delta)
    capture(
        hold=hold,
        amount=delta,
        key=f"attempt:{attempt.pk}:progress:{total}",
        reason=f"job {attempt.job_id} attempt {attempt.number} usage {usage.billable_gpu_ms} gpu-ms",
    )
    hold.captured = total
    metrics.credits_captured(attempt=attempt, amount=delta)  # counted on commit
    AttemptUsage.objects.filter(pk=usage.pk).update(
        captured_gpu_ms=captured_gpu_ms_for(
            billable=usage.billable_gpu_ms, captured=total, rate=attempt.rate_per_gpu_hour
        )
    )
    return delta


def try_extend(attempt: JobAttempt, hold: Hold, amount: int, *, why: str = "usage") -> str:
    """Extend by `amount` in a savepoint; returns "" or the refusal's detail. Caller holds the
    attempt's hold lock (budgets, then buckets, are locked here)."""
    from budgets.services import record_extension

    # The run is on one type: credits restricted to it may fund the extension (the hold is then
    # narrowed to it; a requeue gets a fresh hold).
    run_type = None if len(hold.gpu_types) == 1 else (
        GpuType.objects.filter(pk=attempt.gpu_type_id).values_list("name", flat=True).first())
    try:
        with transaction.atomic():  # a refusal must leave the caller's transaction usable
            record_extension(hold=hold, amount=amount)
            extend_hold(hold=hold, amount=amount, key=f"attempt:{attempt.pk}:extend:{hold.authorized}",
                        run_type=run_type, reason=f"job {attempt.job_id} attempt {attempt.number} {why}")
    except DomainError as refusal:
        return str(refusal.detail)
    return ""


def _low_water(attempt: JobAttempt, hold: Hold) -> int:
    """Below this much left on the hold, it is extended: the look-ahead, or 10 % of what it pays for."""
    percent = conf.seconds("METERING_EXTEND_WHEN_LEFT_PERCENT")
    return max(lookahead_cost(attempt), -(-pays_for(hold) * percent // 100))


def _may_extend(attempt: JobAttempt, job: Job, hold: Hold, usage: AttemptUsage) -> bool:
    """Whether this charge will try an extension: the hold does not pay for the most the run can
    bill yet (`extension_amount` is then positive; review: without this, every charge in the last
    tenth of a long run locked the org's buckets to extend nothing), and what it has left after the
    capture it is about to make is below the low-water mark (a capture moves money from
    `remaining` to `captured`; what the hold pays for stays)."""
    if pays_for(hold) >= max_cost(attempt, job):
        return False
    due = cost(usage.billable_gpu_ms, attempt.rate_per_gpu_hour)
    left = hold.remaining - max(0, min(due - hold.captured, hold.remaining))
    return left < _low_water(attempt, hold)


def lock_ahead_for_extension(hold: Hold) -> None:
    """Before a capture or settlement that an extension of the (locked) hold follows or precedes,
    lock at once, in lock order, what both will touch: the budget periods the hold counts in and
    the current ones of its scope, then every unexpired bucket of its org and its own lines'
    buckets, by id. Otherwise the capture locks its periods, buckets and the org's audit head, and
    the extension then the current periods (a new month's) and the org's buckets: a period after
    buckets, a lower bucket after a higher (review: deadlocks with a submission or a settlement)."""
    from budgets.services import lock_periods_ahead
    from ledger.locks import lock_buckets_ahead

    lock_periods_ahead(extending=[hold], releasing=[hold])
    lock_buckets_ahead(extending_orgs=[hold.org_id], releasing=[hold.pk])


@retry_on_conflict()
@transaction.atomic
def charge_progress(*, attempt: JobAttempt) -> ChargeResult:
    """Capture the attempt's progress; extend its hold or stop it for lack of credit. Idempotent."""
    from scheduling.services.lifecycle import request_stop

    # Lock order: job -> attempt -> hold -> usage -> (budgets -> buckets inside the services).
    job = Job.objects.select_for_update(of=("self",)).select_related("org").get(pk=attempt.job_id)
    attempt = JobAttempt.objects.select_for_update().get(pk=attempt.pk)
    if attempt.state not in (AttemptState.RUNNING, AttemptState.STOPPING):
        return ChargeResult()
    hold = lock_hold(attempt.hold_id)
    usage = lock_usage(attempt)
    if hold.state != HoldState.ACTIVE or usage is None:
        return ChargeResult()
    actions: list[Action] = []
    if attempt.state == AttemptState.RUNNING and _may_extend(attempt, job, hold, usage):
        lock_ahead_for_extension(hold)
    captured = _capture_progress(attempt, hold, usage)
    if captured:
        actions.append(Action.CAPTURED)
    if attempt.state != AttemptState.RUNNING:
        return ChargeResult(captured=captured, actions=tuple(actions))
    hold.refresh_from_db()
    lookahead = lookahead_cost(attempt)
    if hold.remaining >= _low_water(attempt, hold):
        return ChargeResult(captured=captured, actions=tuple(actions))
    amount = extension_amount(attempt, job, hold, lookahead)
    if amount <= 0:
        # The hold already covers the whole max wall time; the agent enforces that limit.
        return ChargeResult(captured=captured, actions=tuple(actions))
    refusal = try_extend(attempt, hold, amount)
    # A whole window is more than the org can fund: the least that keeps the look-ahead covered,
    # so the job runs on until its credits (or budget) are all but spent; or, when less, what
    # makes the hold pay for the whole run (QA: an org funded with exactly its job's estimate had
    # the job stopped in a windowed hold's last look-ahead, its last credits never asked for).
    to_whole_run = run_cost(attempt, job) - pays_for(hold)
    least = min(x for x in (lookahead - hold.remaining, to_whole_run, amount) if x > 0)
    if refusal and least < amount:
        refusal, amount = try_extend(attempt, hold, least), least
    if not refusal:
        actions.append(Action.EXTENDED)
        return ChargeResult(captured=captured, extended=amount, actions=tuple(actions))
    if hold.remaining >= lookahead or covers_whole_run(attempt, job, hold):
        return ChargeResult(captured=captured, actions=tuple(actions))  # try again next run
    request_stop(
        attempt=attempt, reason="out_of_credit", grace_seconds=conf.seconds("METERING_OUT_OF_CREDIT_GRACE_S"),
        detail=f"its hold could not be extended by {format_credits(amount)} credits: {refusal}",
    )
    record(
        action="metering.out_of_credit",
        subject_type="attempt",
        subject_id=attempt.pk,
        org_id=attempt.org_id,
        actor_type=AuditEvent.ActorType.SYSTEM,
        amount=hold.remaining,
        reason_code="out_of_credit",
        data={"job": job.pk, "hold": hold.pk, "wanted": amount, "refusal": refusal[:200]},
    )
    actions.append(Action.STOPPED)
    return ChargeResult(captured=captured, actions=tuple(actions))
