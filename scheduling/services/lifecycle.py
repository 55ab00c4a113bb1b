"""The job lifecycle, in one place: the transition table and every state change of jobs and attempts.

States: queued -> scheduled -> running -> (completed | failed | cancelled | timed_out | preempted),
and preempted -> queued again. Each change is a conditional UPDATE (`filter(state=from)`) made
under the job's row lock and audited with a reason code in the same transaction.

Attempt outcomes (what the agent reports, docs/agent-protocol.md §5) are either permanent (the job
ends) or transient (`lost`, `preempted`, `evicted`, `withdrawn`: the job is queued again with a fresh
hold). A node loss counts against `Job.max_retries` and backs off exponentially (`Job.not_before`);
a preemption is the scheduler's own decision, an eviction an operator's, a withdrawal (its node went
silent before it started) the sweep's, so none of them counts as a retry or backs off.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q

from audit.models import AuditEvent
from audit.services import record
from config.clock import db_now, db_wall_clock
from config.errors import DomainError
from scheduling.core import reasons
from scheduling.grants import class_not_granted
from scheduling.models import (
    DETAIL_MAX_LENGTH,
    TERMINAL_JOB_STATES,
    Allocation,
    AttemptState,
    Job,
    JobAttempt,
    JobState,
)
from scheduling.services import dependencies

S = JobState
TRANSITIONS: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED}),
    # scheduled -> queued/preempted: the attempt was lost or preempted before the agent started it.
    S.SCHEDULED: frozenset(
        {S.RUNNING, S.QUEUED, S.PREEMPTED, S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT}
    ),
    S.RUNNING: frozenset({S.QUEUED, S.PREEMPTED, S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT}),
    S.PREEMPTED: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
}

# Outcomes an attempt can end with, and where each sends the job.
PERMANENT_OUTCOMES: dict[str, str] = {
    "completed": S.COMPLETED,
    "failed": S.FAILED,  # non-zero exit
    "launch_failed": S.FAILED,  # bad command / image: retrying cannot help
    "timed_out": S.TIMED_OUT,
    "cancelled": S.CANCELLED,
    "out_of_credit": S.FAILED,
}
# lost: the node went silent (counts as a retry, backs off); preempted: for a higher class;
# evicted: its node was taken out of service by an operator; withdrawn: its node went silent
# before it started (the server's decision; neither of the last two counts nor backs off).
# refused: its node's agent refused to start it (GPUs the node does not have): the node is drained.
TRANSIENT_OUTCOMES = frozenset({"lost", "preempted", "evicted", "withdrawn", "refused"})
OUTCOMES = frozenset(PERMANENT_OUTCOMES) | TRANSIENT_OUTCOMES
LIVE_ATTEMPT_STATES = (AttemptState.SCHEDULED, AttemptState.RUNNING, AttemptState.STOPPING)


class IllegalTransition(DomainError):
    """The job is not in a state from which this change is allowed."""

    type = "illegal-job-transition"
    status = 409
    title = "Job state conflict"


class UnknownOutcome(DomainError):
    type = "unknown-attempt-outcome"
    status = 400
    title = "Unknown attempt outcome"


def can_transition(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


def _setting(name: str, default: int) -> int:
    return int(getattr(settings, name, default))


def retry_backoff(retry_number: int) -> timedelta:
    """Delay before retry `n` (1-based): base * 2**(n-1), capped."""
    base = _setting("SCHEDULER_RETRY_BACKOFF_SECONDS", 30)
    cap = _setting("SCHEDULER_RETRY_BACKOFF_MAX_SECONDS", 3600)
    return timedelta(seconds=min(cap, base * 2 ** max(0, retry_number - 1)))


def lock_job(job_id: int) -> Job:
    return Job.objects.select_for_update(of=("self",)).get(pk=job_id)


def audit_actor(actor: Any) -> tuple[str, str]:
    if actor is None:
        return AuditEvent.ActorType.SYSTEM, ""
    return AuditEvent.ActorType.USER, str(getattr(actor, "pk", actor))


@transaction.atomic
def transition(
    job: Job,
    to: str,
    *,
    reason_code: str = "",
    actor: Any = None,
    actor_type: str | None = None,
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> Job:
    """Move `job` to state `to` (table above); extra `fields` are written in the same UPDATE.

    Locks the job row and re-reads it, so `job` may be stale; raises IllegalTransition when the
    current state does not allow `to`. Updates `job` in place and returns it.
    """
    current = lock_job(job.pk)
    if not can_transition(current.state, to):
        raise IllegalTransition(
            f"Job {job.pk} cannot go from {current.state} to {to}.",
            job_id=job.pk,
            state=current.state,
            to=to,
        )
    now = db_now()
    if to in TERMINAL_JOB_STATES:
        fields.setdefault("finished_at", now)
    changed = Job.objects.filter(pk=job.pk, state=current.state).update(
        state=to, updated_at=now, **fields
    )
    if changed != 1:  # impossible under the lock; the check keeps the claim honest
        raise IllegalTransition(f"Job {job.pk} changed state concurrently.", job_id=job.pk)
    kind, actor_id = audit_actor(actor)
    record(
        action="sched.job.transition",
        subject_type="job",
        subject_id=job.pk,
        org_id=job.org_id,
        actor_type=actor_type or kind,
        actor_id=actor_id,
        reason_code=reason_code or to,
        data={"from": current.state, "to": to, **(data or {})},
    )
    for name, value in fields.items():
        setattr(job, name, value)
    job.state = to
    job.updated_at = now
    if to in TERMINAL_JOB_STATES:
        # After the commit, in transactions of their own: the ending transaction may already hold
        # the org's ledger rows, and locking a dependent's job row after them would invert the
        # lock order (job before ledger rows) of a concurrent cancel of that dependent.
        transaction.on_commit(partial(_after_end, job_id=job.pk, ended=to), robust=True)
    return job


def _after_end(*, job_id: int, ended: str) -> None:
    if ended in dependencies.UNSUCCESSFUL:
        cancel_dependents(job_id=job_id, ended=ended)
    refresh_dependents(job_id=job_id)


def refresh_dependents(*, job_id: int) -> int:
    """Queued jobs still waiting for this one (and maybe others): their `dependency` detail names
    only the jobs they still wait for, or is cleared once all have ended (the next pass gives them
    a reason of its own). Returns how many changed."""
    changed = 0
    waiting = Job.objects.filter(state=S.QUEUED, wait_reason=reasons.DEPENDENCY)
    for dependent in waiting.filter(depends_on=job_id):
        reason, detail = dependencies.wait_reason_of(dependent)
        if (reason, detail) != (dependent.wait_reason, dependent.wait_detail):
            changed += waiting.filter(pk=dependent.pk).update(wait_reason=reason, wait_detail=detail)
    return changed


def cancel_dependents(*, job_id: int, ended: str) -> int:
    """Cancel the queued `afterok` jobs waiting for a job that ended unsuccessfully (their
    dependency can never be met) and release their holds, each in its own transaction; each
    cancellation cascades to the jobs waiting for it in turn. Returns how many. A failure here
    (a crash, say) is made good by `cancel_orphaned_dependents`."""
    cancelled = 0
    for dependent_id in dependencies.waiting_afterok(job_id):
        with transaction.atomic():
            cancelled += _cancel_for_dependency(dependent_id=dependent_id, dependency_id=job_id, ended=ended)
    return cancelled


def _cancel_for_dependency(*, dependent_id: int, dependency_id: int, ended: str) -> int:
    job = lock_job(dependent_id)
    if job.state != S.QUEUED:  # started or ended meanwhile: nothing to cancel
        return 0
    if job.current_hold_id is not None:
        _release_whole_hold(hold_id=job.current_hold_id, key=f"job:{job.pk}:dependency-failed", actor=None)
    # Which dependency and how it ended, in words (QA: end_detail was empty).
    detail = f"job {dependency_id} it depends on (afterok) ended {ended}"[:DETAIL_MAX_LENGTH]
    transition(job, S.CANCELLED, reason_code=reasons.DEPENDENCY_FAILED, end_reason=reasons.DEPENDENCY_FAILED,
               end_detail=detail, wait_reason="", wait_detail="", expected_start_at=None, held=False,
               held_by_operator=False, data={"dependency": dependency_id, "dependency_state": ended})
    return 1


def cancel_orphaned_dependents() -> int:
    """Beat: cancel queued `afterok` jobs whose dependency ended unsuccessfully but which the
    cascade above missed (submitted while it ran, or it did not run). Each in its own transaction."""
    cancelled = 0
    for dependent_id, dependency_id in dependencies.orphaned_afterok():
        with transaction.atomic():
            ended = Job.objects.filter(pk=dependency_id).values_list("state", flat=True).get()
            cancelled += _cancel_for_dependency(
                dependent_id=dependent_id, dependency_id=dependency_id, ended=ended
            )
    return cancelled


@transaction.atomic
def mark_attempt_started(*, attempt: JobAttempt) -> JobAttempt:
    """The agent started the attempt: attempt scheduled -> running, job scheduled -> running.

    Idempotent: a repeated start report changes nothing. An attempt already asked to stop keeps
    `stopping` but records its start time.
    """
    job = lock_job(attempt.job_id)
    attempt = JobAttempt.objects.select_for_update().get(pk=attempt.pk)
    if attempt.state == AttemptState.ENDED or attempt.started_at is not None:
        return attempt
    now = db_now()
    new_state = AttemptState.STOPPING if attempt.state == AttemptState.STOPPING else AttemptState.RUNNING
    JobAttempt.objects.filter(pk=attempt.pk, state=attempt.state).update(
        state=new_state, started_at=now
    )
    attempt.state, attempt.started_at = new_state, now
    if job.state == S.SCHEDULED:
        transition(job, S.RUNNING, reason_code="started", actor_type=AuditEvent.ActorType.AGENT,
                   data={"attempt": attempt.number})
    return attempt


def _stop_changes(attempt: JobAttempt, reason: str) -> bool:
    """Whether a stop request changes the (locked) attempt: not if it ended, nor if it is already
    stopping -- unless a cancellation overrides another reason."""
    if attempt.state == AttemptState.ENDED:
        return False
    if attempt.state == AttemptState.STOPPING:
        return reason == "cancelled" and attempt.stop_reason != "cancelled"
    return True


@transaction.atomic
def request_stop(
    *, attempt: JobAttempt, reason: str, grace_seconds: int | float | None = None, detail: str = ""
) -> JobAttempt:
    """Ask the agent to stop a live attempt (SIGTERM, then SIGKILL after `grace_seconds`).

    The attempt becomes `stopping`; its GPUs stay allocated until the agent reports the exit
    (finish_attempt). Asking again is a no-op, except that a cancellation overrides an earlier
    reason, so the job ends as the user asked.
    """
    if grace_seconds is None:
        grace_seconds = _setting("SCHEDULER_STOP_GRACE_SECONDS", 30)
    lock_job(attempt.job_id)
    current = JobAttempt.objects.select_for_update().get(pk=attempt.pk)
    if not _stop_changes(current, reason):
        return current
    now = db_now()
    # A stop already under way keeps its grace: the agent acts on the first stop it receives (it
    # signalled the job then and kills it when that grace ends), so a later cancellation changes
    # the reason (how the job ends) but not the kill time, and the record says so.
    grace = current.grace_seconds if current.state == AttemptState.STOPPING else int(grace_seconds)
    changed = JobAttempt.objects.filter(pk=current.pk, state=current.state).update(
        state=AttemptState.STOPPING,
        stop_requested_at=current.stop_requested_at or now,
        stop_reason=reason,
        stop_detail=detail[:DETAIL_MAX_LENGTH],
        grace_seconds=grace,
    )
    if changed == 1:
        data = {"job": current.job_id, "attempt": current.number, "grace_seconds": grace}
        if current.state == AttemptState.STOPPING:
            data["overrides"] = current.stop_reason
        record(
            action="sched.attempt.stop",
            subject_type="attempt",
            subject_id=current.pk,
            org_id=current.org_id,
            actor_type=AuditEvent.ActorType.SCHEDULER,
            reason_code=reason,
            data=data,
        )
    current.refresh_from_db()
    return current


@transaction.atomic
def cancel_job(*, job: Job, actor: Any = None) -> Job:
    """Cancel a job. Queued: release its hold and cancel now. Scheduled/running: stop the attempt;
    the job becomes cancelled when the agent reports the exit. Cancelling twice is a no-op."""
    job = lock_job(job.pk)
    if job.state == S.CANCELLED:
        return job
    if job.state in (S.QUEUED, S.PREEMPTED):
        hold = job.current_hold
        if hold is not None:
            _release_whole_hold(hold_id=hold.pk, key=f"job:{job.pk}:cancel", actor=actor)
        return transition(job, S.CANCELLED, reason_code="cancelled", actor=actor, end_reason="cancelled",
                          wait_reason="", wait_detail="", expected_start_at=None, held=False,
                          held_by_operator=False)
    if job.state in (S.SCHEDULED, S.RUNNING):
        attempt = JobAttempt.objects.filter(job=job, state__in=LIVE_ATTEMPT_STATES).first()
        if attempt is not None:
            request_stop(attempt=attempt, reason="cancelled")
        kind, actor_id = audit_actor(actor)
        record(
            action="sched.job.cancel_requested",
            subject_type="job",
            subject_id=job.pk,
            org_id=job.org_id,
            actor_type=kind,
            actor_id=actor_id,
            reason_code="cancelled",
            data={"state": job.state},
        )
        return job
    raise IllegalTransition(
        f"Job {job.pk} already ended ({job.state}).", job_id=job.pk, state=job.state, to=S.CANCELLED
    )


def _release_whole_hold(*, hold_id: int, key: str, actor: Any) -> None:
    """Release everything left on a hold: budgets first (after locking the hold), then buckets."""
    from budgets.services import record_release
    from ledger.locks import lock_hold
    from ledger.models import HoldState
    from ledger.services import release_hold

    hold = lock_hold(hold_id)
    if hold.state != HoldState.ACTIVE:
        return
    if hold.remaining:
        record_release(hold=hold, amount=hold.remaining)
    release_hold(hold=hold, key=key, actor=actor, reason="job cancelled")


def effective_outcome(attempt: JobAttempt, reported: str) -> str:
    """What an attempt's end means: a requested stop explains the exit unless the job completed."""
    if reported not in OUTCOMES:
        raise UnknownOutcome(f"Unknown outcome {reported!r}.", outcome=reported)
    if attempt.stop_reason and reported != "completed":
        return attempt.stop_reason
    return reported


def end_gang_part(*, attempt: JobAttempt, node_id: int, outcome: str, exit_code: int | None) -> bool:
    """A part of a gang on several nodes exited on `node_id` while parts on other nodes still run:
    release this node's GPUs, keep the first part's outcome (it decides how the attempt ends, as a
    Slurm job ends with its batch step), and ask the other parts to stop with the timeout grace.
    False when no other part runs: the caller ends the attempt. Caller holds the job and attempt
    locks (review: the first part's exit ended the attempt and released the other nodes' GPUs
    while their parts still ran)."""
    others = Allocation.objects.filter(attempt_id=attempt.pk, released_at__isnull=True,
                                       started_at__isnull=False).exclude(node_id=node_id)
    if not others.exists():
        return False
    from metering.conf import timeout_grace_seconds

    now = db_now()
    Allocation.objects.filter(attempt_id=attempt.pk, node_id=node_id, released_at__isnull=True).update(
        released_at=now)
    fields: dict[str, Any] = {}
    if not attempt.first_part_outcome:
        fields.update(first_part_outcome=effective_outcome(attempt, outcome), first_part_exit_code=exit_code)
        from metering.models import AttemptUsage

        # What the gang had billed when its first part ended, and when: the parts still running
        # are billed from there by the server's clock at settlement (`settlement.gang_billable`).
        # The wall clock, not the transaction's start: the base is read after this transaction's
        # lock waits, and a part's report committed during them is in it (review: counted again).
        AttemptUsage.objects.filter(attempt_id=attempt.pk, gang_base_at__isnull=True).update(
            gang_base_gpu_ms=F("billable_gpu_ms"), gang_base_at=db_wall_clock())
    if attempt.state == AttemptState.RUNNING:
        # No stop reason: the first part's outcome, not a stop, explains how the attempt ends.
        fields.update(state=AttemptState.STOPPING, stop_requested_at=now,
                      grace_seconds=int(timeout_grace_seconds()))
    JobAttempt.objects.filter(pk=attempt.pk).update(**fields)
    record(action="sched.attempt.part_ended", subject_type="attempt", subject_id=attempt.pk,
           org_id=attempt.org_id, actor_type=AuditEvent.ActorType.AGENT, actor_id=str(node_id),
           reason_code=outcome, data={"job": attempt.job_id, "attempt": attempt.number, "node": node_id,
                                      "exit_code": exit_code})
    return True


@transaction.atomic
def finish_attempt(*, attempt: JobAttempt, outcome: str, exit_code: int | None = None) -> Job:
    """End an attempt: release its GPUs, settle its usage, then requeue the job or end it.

    Exactly once: a second report for an ended attempt returns the job unchanged.
    """
    job = lock_job(attempt.job_id)
    attempt = JobAttempt.objects.select_for_update().get(pk=attempt.pk)
    if attempt.state == AttemptState.ENDED:
        return job
    final = effective_outcome(attempt, outcome)
    if attempt.first_part_outcome:  # a gang whose first part has exited: that part says how it ended
        final, exit_code = attempt.first_part_outcome, attempt.first_part_exit_code
    now = db_now()
    changed = JobAttempt.objects.filter(pk=attempt.pk, state=attempt.state).update(
        state=AttemptState.ENDED, ended_at=now, outcome=final, exit_code=exit_code
    )
    if changed != 1:
        return job
    attempt.state, attempt.ended_at, attempt.outcome, attempt.exit_code = (
        AttemptState.ENDED, now, final, exit_code
    )
    Allocation.objects.filter(attempt=attempt, released_at__isnull=True).update(released_at=now)
    # A node loss is retried while retries remain (this attempt counts: it is ended above).
    retries_used = JobAttempt.objects.filter(job=job, outcome="lost").count() if final == "lost" else 0
    if final in TRANSIENT_OUTCOMES and retries_used <= job.max_retries:
        lock_ledger_for_requeue(job=job, attempt=attempt)

    from metering.services import settle_attempt  # metering owns the final capture
    from scheduling.tasks import schedule_soon

    settle_attempt(attempt=attempt, outcome=final)
    schedule_soon(trigger="finish")  # freed GPUs: place the next job without waiting for beat
    data = {"attempt": attempt.number, "outcome": final, "exit_code": exit_code}
    if final in PERMANENT_OUTCOMES:
        detail = attempt.stop_detail if final == attempt.stop_reason else ""
        return transition(job, PERMANENT_OUTCOMES[final], reason_code=final,
                          actor_type=AuditEvent.ActorType.AGENT, data=data, end_reason=final,
                          end_detail=detail)
    if final == "preempted":
        transition(job, S.PREEMPTED, reason_code="preempted", data=data)
        return requeue(job=job, not_before=None, reason_code="requeued-after-preemption")
    if final == "evicted":
        return requeue(job=job, not_before=None, reason_code="requeued-after-eviction", data=data)
    if final == "refused":  # the node's fault, not the job's: no retry spent, no backoff
        return requeue(job=job, not_before=None, reason_code="requeued-start-refused-by-node", data=data)
    if final == "withdrawn":
        return requeue(job=job, not_before=None, reason_code="requeued-node-silent-before-start", data=data)
    # A lost node: retry with exponential backoff while retries remain.
    if retries_used > job.max_retries:
        # QA: the reason alone did not say what was retried, or how often.
        detail = (f"its node was lost {retries_used} times (attempts ending lost); max_retries is "
                  f"{job.max_retries}")
        return transition(job, S.FAILED, reason_code="retries-exhausted", data=data,
                          end_reason="retries-exhausted", end_detail=detail)
    return requeue(job=job, not_before=now + retry_backoff(retries_used),
                   reason_code="requeued-after-node-lost", data=data)


def lock_ledger_for_requeue(*, job: Job, attempt: JobAttempt) -> None:
    """Before an ending attempt's settlement, take every ledger lock its requeue will need, in the
    order of DESIGN.md §6: the old hold, its usage row, then at once the budget periods (those the
    old hold counts in and the current ones of the job's scope, which the new hold counts in),
    then at once the org's buckets by id (every unexpired one: the new hold may draw on any of
    them) and the old hold's. Settled first and funded after, in one transaction, the requeue
    locked the old hold's buckets (and the org's audit chain head) and only then the periods and
    every eligible bucket of the new hold: a lower-id bucket after a higher one, against the
    order a submission or a charge's extension takes them, a deadlock with either (review). The
    settlement and `fund_job` then find these rows already held; a bucket issued meanwhile has the
    highest id, locked last, still in order. Call it with the job and the attempt locked."""
    from budgets.services import lock_periods_ahead
    from ledger.locks import lock_buckets_ahead, lock_hold
    from ledger.models import Hold, HoldState
    from metering.settlement import lock_usage

    old = lock_hold(attempt.hold_id)
    lock_usage(attempt)  # after the hold, as the settlement and a charge take it
    releasing = [old] if old.state == HoldState.ACTIVE else []
    new = Hold(org_id=job.org_id, project_id=job.project_id, user_id=job.user_id)  # the new hold's scope
    lock_periods_ahead(extending=[new], releasing=releasing)
    lock_buckets_ahead(extending_orgs=[job.org_id], releasing=[h.pk for h in releasing])


def requeue(
    *, job: Job, not_before: Any, reason_code: str, data: dict[str, Any] | None = None
) -> Job:
    """Queue the job again with a fresh hold. If the hold cannot be funded, the job still waits
    (reason `budget`, no hold) and `fund_waiting_jobs` tries again later."""
    retry_at = reasons.utc_time(not_before.timestamp()) if not_before else ""
    wait = (reasons.BACKOFF, f"retry not before {retry_at}") if not_before else ("", "")
    transition(job, S.QUEUED, reason_code=reason_code, data=data, not_before=not_before,
               current_hold=None, wait_reason=wait[0], wait_detail=wait[1], expected_start_at=None)
    fund_job(job=job)
    return job


def funding_retry_at(now: datetime) -> datetime:
    """When a job whose hold could not be funded (or topped up) is offered to the scheduler again."""
    return now + timedelta(seconds=_setting("SCHEDULER_FUNDING_RETRY_SECONDS", 60))


def fund_job(*, job: Job, actor: Any = None) -> bool:
    """Give a queued job without a hold a fresh one; on a funding/budget refusal, mark it waiting.
    `actor`: the user whose request funds it (a release), else the system."""
    from scheduling.services.reservation import hold_seconds, price_job_hold, reserve_job_hold

    key = f"job:{job.pk}:attempt:{job.attempt_count + 1}:hold"
    try:
        with transaction.atomic():  # savepoint: a refusal must not poison the caller's transaction
            hold, priced = reserve_job_hold(job=job, key=key, actor=actor)
    except DomainError as error:
        # Try again later (fund_waiting_jobs); until then the job is not offered to the scheduler.
        # A retry backoff (a lost node, `not_before`) still stands: funding never shortens it.
        retry_at = funding_retry_at(db_now())
        detail = str(error.detail)[:DETAIL_MAX_LENGTH]
        changed = Job.objects.filter(pk=job.pk, current_hold__isnull=True).update(
            wait_reason=reasons.BUDGET, wait_detail=detail, funding_retry_at=retry_at, expected_start_at=None
        )
        if changed and (job.wait_reason, job.wait_detail) != (reasons.BUDGET, detail):
            record(action="sched.job.funding_refused", subject_type="job", subject_id=job.pk,
                   org_id=job.org_id, reason_code=reasons.BUDGET,
                   data={"detail": detail, "type": getattr(error, "type", ""),
                         "retry_at": reasons.utc_time(retry_at.timestamp())})
        job.wait_reason, job.wait_detail, job.funding_retry_at = reasons.BUDGET, detail, retry_at
        return False
    # Without a hold window the hold is the whole run; with one, the run is priced (at today's prices).
    windowed = hold_seconds(job) < job.max_wall_seconds
    estimate = price_job_hold(job, priced, whole_run=True) if windowed else hold.authorized
    fields: dict[str, Any] = {"current_hold": hold, "estimate": estimate, "funding_retry_at": None}
    if job.wait_reason == reasons.BUDGET:  # no longer short of money (review: funded during a
        # backoff, it said `budget` until the backoff ended and a pass rewrote it)
        fields["wait_reason"], fields["wait_detail"] = wait_when_funded(job, db_now())
    Job.objects.filter(pk=job.pk).update(**fields)
    for name, value in fields.items():
        setattr(job, name, value)
    return True


def wait_when_funded(job: Job, now: datetime) -> tuple[str, str]:
    """A queued job's wait once it has its hold: its dependencies, its retry backoff, its class no
    longer granted to its org (QA: a release blanked it until the next pass), or none yet (the
    next pass says)."""
    from scheduling.grants import not_granted_wait
    from scheduling.services import dependencies

    wait = dependencies.wait_reason_of(job)
    if not wait[0] and job.not_before is not None and job.not_before > now:
        wait = (reasons.BACKOFF, f"retry not before {reasons.utc_time(job.not_before.timestamp())}")
    if not wait[0]:
        wait = not_granted_wait(job.pk) or wait
    return wait


def fund_waiting_jobs(*, limit: int = 100, org_id: int | None = None) -> int:
    """Give queued jobs without a hold (refused at requeue) another try; returns how many got one.
    Not held jobs: a refusal would overwrite their `held` wait (QA: a held job showed `budget` and
    left the `held` filter); `release_job` funds one when it is released. Nor jobs whose org lost
    the grant of their class: they cannot run, and would hold credits meanwhile (review)."""
    now = db_now()
    ids = list(
        Job.objects.filter(state=S.QUEUED, current_hold__isnull=True, held=False)
        .exclude(class_not_granted())
        .filter(Q(funding_retry_at__isnull=True) | Q(funding_retry_at__lte=now))
        .filter(Q() if org_id is None else Q(org_id=org_id))
        .order_by("submitted_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    funded = 0
    for job_id in ids:
        with transaction.atomic():
            job = lock_job(job_id)
            if job.state == S.QUEUED and job.current_hold_id is None and not job.held:
                funded += fund_job(job=job)
    return funded


def retry_funding_of(*, org_id: int) -> int:
    """The org's jobs that wait for funds are due now: those without a hold get one if they can
    (`fund_waiting_jobs`, theirs first), those whose top-up was refused try the dearer type again.
    Their rows are locked in id order, as a pass locks them; a retry backoff (`not_before`)
    stands. Returns how many got a hold."""
    now = db_now()
    with transaction.atomic():
        due = list(
            Job.objects.select_for_update().filter(state=S.QUEUED, org_id=org_id)
            .filter(Q(funding_retry_at__gt=now) | Q(price_capped_until__gt=now))
            .order_by("pk").values_list("pk", flat=True)
        )
        Job.objects.filter(pk__in=due, funding_retry_at__gt=now).update(funding_retry_at=now)
        Job.objects.filter(pk__in=due, price_capped_until__gt=now).update(price_capped_until=now)
    funded = fund_waiting_jobs(org_id=org_id)
    from scheduling.tasks import schedule_soon

    schedule_soon(trigger="funds")
    return funded


@transaction.atomic
def request_stop_many(
    *, items: list[tuple[int, int | float | None]], reason: str
) -> dict[int, JobAttempt]:
    """`request_stop` for many attempts: [(attempt id, grace seconds or None)] -> attempts re-read.

    Same per-attempt rules and audit event as `request_stop`, with the locks taken in bulk and in
    the usual order (their jobs by id, then the attempts by id), one UPDATE and one audit batch.
    """
    from audit.services import NewEvent, record_many

    if not items:
        return {}
    default_grace = _setting("SCHEDULER_STOP_GRACE_SECONDS", 30)
    graces = {a: int(default_grace if g is None else g) for a, g in items}
    job_ids = JobAttempt.objects.filter(pk__in=graces).values_list("job_id", flat=True)
    list(Job.objects.select_for_update(of=("self",)).filter(pk__in=job_ids).order_by("pk").values_list("pk"))
    # ^ the jobs first (lock order: job -> attempt), then their attempts, each set by id
    current = {
        a.pk: a
        for a in JobAttempt.objects.select_for_update(of=("self",)).filter(pk__in=graces).order_by("pk")
    }
    now = db_now()
    to_stop = [a for a in current.values() if _stop_changes(a, reason)]
    if to_stop:
        # Rows are locked, so each conditional UPDATE (state unchanged) matches all of its ids;
        # one UPDATE per (state, grace, first request or not), a handful in practice.
        for state in {a.state for a in to_stop}:
            group = [a for a in to_stop if a.state == state]
            for grace in {graces[a.pk] for a in group}:
                ids = [a.pk for a in group if graces[a.pk] == grace]
                base = JobAttempt.objects.filter(pk__in=ids, state=state)
                base.filter(stop_requested_at__isnull=True).update(
                    state=AttemptState.STOPPING, stop_requested_at=now, stop_reason=reason,
                    grace_seconds=grace,
                )
                base.filter(stop_requested_at__isnull=False).update(
                    state=AttemptState.STOPPING, stop_reason=reason, grace_seconds=grace,
                )
        record_many([
            NewEvent(
                action="sched.attempt.stop", subject_type="attempt", subject_id=a.pk, org_id=a.org_id,
                actor_type=AuditEvent.ActorType.SCHEDULER, reason_code=reason,
                data={"job": a.job_id, "attempt": a.number, "grace_seconds": graces[a.pk]},
            )
            for a in to_stop
        ])
    return {a.pk: a for a in JobAttempt.objects.filter(pk__in=graces)}
