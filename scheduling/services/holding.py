"""Holding a queued job back (Slurm's `scontrol hold` / `release`, `sbatch --hold`).

Not a state change: a held job stays `queued` with its credits held; `held` keeps it out of the
scheduler's snapshot (`adapter.snapshot.load_pending`) and out of a placement decided before it
was held (`adapter.writer`, under the job's row lock). Its aging restarts at the release
(`Job.aging_from`), so holding a job never buys it queue time.

Two kinds, as in Slurm: a user's hold, which the job's users may release, and an operator's hold
(the admin's Hold action: `operator=True`), which only an operator may release. An operator's
hold over a user's turns it into an operator's; a user's hold over an operator's changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from audit.services import record
from config.clock import db_now
from config.errors import DomainError
from scheduling.core import reasons
from scheduling.models import Job, JobState
from scheduling.services.lifecycle import IllegalTransition, audit_actor, fund_job, lock_job, wait_when_funded


class HeldByOperator(DomainError):
    """Only an operator may release a job an operator held."""

    type = "held-by-operator"
    status = 403
    title = "Held by an operator"


@transaction.atomic
def hold_job(*, job: Job, actor: Any = None, operator: bool = False) -> Job:
    """Keep a queued job from being scheduled until it is released (Slurm's `scontrol hold`); its
    credits stay held. Holding a held job changes nothing (except an operator's hold over a
    user's); a job in any other state is 409."""
    job = lock_job(job.pk)
    if job.state != JobState.QUEUED:
        raise IllegalTransition(
            f"Job {job.pk} is {job.state}; only a queued job can be held.", job_id=job.pk, state=job.state
        )
    if job.held and (job.held_by_operator or not operator):
        return job
    wait = (reasons.HELD, held_detail(actor, job.pk, operator=operator))
    return _set_held(job, actor, held=True, wait=wait, held_by_operator=operator)


def held_detail(actor: Any, job_id: int | None, *, operator: bool = False) -> str:
    who = actor.get_username() if hasattr(actor, "get_username") else "the system"
    if operator:
        return f"held by an operator ({who}) until an operator releases it"[:255]
    if job_id is None:  # not inserted yet
        return f"held by {who} until released"[:255]
    return f"held by {who} until released (POST /api/v1/jobs/{job_id}/release)"[:255]


@transaction.atomic
def release_job(*, job: Job, actor: Any = None, operator: bool = False) -> Job:
    """Let a held job be scheduled again; its aging restarts now (holding never buys queue time).
    Releasing a queued job that is not held changes nothing; a job in any other state is 409; a
    job an operator held is 403 unless an operator releases it."""
    job = lock_job(job.pk)
    if job.state != JobState.QUEUED:
        raise IllegalTransition(
            f"Job {job.pk} is {job.state}; only a queued job can be released.", job_id=job.pk, state=job.state
        )
    if not job.held:
        return job
    if job.held_by_operator and not operator:
        raise HeldByOperator(f"Job {job.pk} was held by an operator; only an operator can release it.",
                             job_id=job.pk)
    now = db_now()
    if job.current_hold_id is None and not fund_job(job=job, actor=actor):
        # Waiting for funds, not a retry backoff (QA: it said `backoff` until the next funding try).
        wait = (job.wait_reason, job.wait_detail)
    else:
        wait = wait_when_funded(job, now)
    job = _set_held(job, actor, held=False, wait=wait, held_by_operator=False, aging_from=now)
    from scheduling.tasks import schedule_soon

    schedule_soon(trigger="release")
    return job


def _set_held(job: Job, actor: Any, *, held: bool, wait: tuple[str, str], held_by_operator: bool,
              **fields: Any) -> Job:
    now = db_now()
    operator = held_by_operator if held else job.held_by_operator  # whose hold this starts or ends
    fields["held_by_operator"] = held_by_operator
    Job.objects.filter(pk=job.pk).update(held=held, wait_reason=wait[0], wait_detail=wait[1],
                                         expected_start_at=None, updated_at=now, **fields)
    kind, actor_id = audit_actor(actor)
    record(action="sched.job.hold" if held else "sched.job.release", subject_type="job", subject_id=job.pk,
           org_id=job.org_id, actor_type=kind, actor_id=actor_id,
           reason_code=reasons.HELD if held else "released",
           data={"state": job.state, "operator": operator})
    job.held, (job.wait_reason, job.wait_detail), job.updated_at = held, wait, now
    for name, value in fields.items():
        setattr(job, name, value)
    return job
