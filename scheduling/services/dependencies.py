"""Job dependencies (Slurm's `--dependency=afterok:…` / `afterany:…`).

A job may name up to `MAX_DEPENDENCIES` earlier jobs of its own organization. It is held at
submission like any job, waits with reason `dependency`, and is offered to the scheduler only once
they have ended: `afterok` when every one completed, `afterany` when every one ended, however.
Under `afterok` a dependency that ends otherwise (failed, cancelled, timed out) cancels the job and
releases its hold (`lifecycle.cancel_dependents`, in the same transaction as that ending), and
`lifecycle.cancel_orphaned_dependents` (beat, every minute) catches a job submitted while its
dependency was ending. The scheduler's filter (`unmet_among`) reads the dependencies' states, so a
job is never offered early whichever of these runs first. Aging counts from when the last dependency
ended, not from submission (Slurm's eligible time).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import connection
from django.db.models import Max, Q

from accounts.selectors import visible_projects
from scheduling.core import reasons
from scheduling.models import TERMINAL_JOB_STATES, Dependency, Job, JobState

if TYPE_CHECKING:
    from accounts.models import Project
    from scheduling.services.submission import JobSpec

MAX_DEPENDENCIES = 16
UNSUCCESSFUL = (JobState.FAILED, JobState.CANCELLED, JobState.TIMED_OUT)
Link = Job.depends_on.through  # (from_job = the dependent, to_job = the job it waits for)


@dataclass(frozen=True, slots=True)
class After:
    """A submission's checked dependencies and the wait reason it starts with."""

    jobs: tuple[Job, ...]
    job_ids: tuple[int, ...]
    wait_reason: str
    wait_detail: str


def met(state: str, dependency: str) -> bool:
    return state == JobState.COMPLETED if dependency == Dependency.AFTER_OK else state in TERMINAL_JOB_STATES


def check(*, user: Any, project: Project, spec: JobSpec) -> After:
    """Every dependency must be a job the user can see, of the project's org, that can still be
    met; raises SubmissionInvalid (errors under `depends_on`) otherwise."""
    from scheduling.services.submission import SubmissionInvalid

    ids = spec.depends_on
    errors: list[str] = []
    if len(ids) > MAX_DEPENDENCIES:
        errors.append(f"At most {MAX_DEPENDENCIES} dependencies.")
    if len(set(ids)) != len(ids):
        errors.append("Dependencies must not repeat.")
    _key_share(ids)
    found = {job.pk: job for job in Job.objects.filter(pk__in=ids, project__in=visible_projects(user))}
    errors += [f"Unknown job {job_id}." for job_id in ids if job_id not in found]
    for job_id in sorted(found):
        job = found[job_id]
        if job.org_id != project.org_id:
            errors.append(f"Job {job_id} belongs to another organization.")
        elif spec.dependency == Dependency.AFTER_OK and job.state in UNSUCCESSFUL:
            errors.append(f"Job {job_id} ended {job.state}: an afterok dependency on it can never be met.")
    if errors:
        raise SubmissionInvalid({"depends_on": errors})
    waiting = sorted(job_id for job_id, job in found.items() if not met(job.state, spec.dependency))
    reason, detail = _wait(waiting, spec.dependency)
    return After(tuple(found[i] for i in ids), tuple(ids), reason, detail)


def _key_share(ids: tuple[int, ...]) -> None:
    """Lock the dependencies' rows FOR KEY SHARE now, before the job insert and the ledger's locks,
    and read their states after (the caller's next query).

    The link rows' foreign keys would take this very lock at COMMIT (Django's constraints are
    deferred), after the submission has locked the org's budget and bucket rows; a dependency
    ending at that moment holds its job row FOR UPDATE and waits for those same bucket rows to
    settle its hold: a deadlock (found by tests/api/test_dependency_race.py). Taken here, it keeps
    the lock order (job rows before ledger rows): an ending that locked first is waited for and
    its outcome seen; one that comes later waits for this submission, and its cascade sees it.
    KEY SHARE does not block other submissions naming the same job."""
    if connection.vendor != "postgresql" or not ids:
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id FROM {Job._meta.db_table} WHERE id = ANY(%s) ORDER BY id FOR KEY SHARE",  # noqa: S608
            [sorted(set(ids))],
        )


def _wait(waiting: list[int], dependency: str) -> tuple[str, str]:
    if not waiting:
        return "", ""
    one = len(waiting) == 1  # QA: "after jobs 37 complete"
    how = ("complete" if dependency == Dependency.AFTER_OK else "end") + ("s" if one else "")
    jobs = "job" if one else "jobs"
    return reasons.DEPENDENCY, f"after {jobs} {', '.join(map(str, waiting))} {how} ({dependency})"[:255]


def wait_reason_of(job: Job) -> tuple[str, str]:
    """(`dependency`, detail) while some of the job's dependencies are not met, else ("", "")."""
    if not job.dependency:
        return "", ""
    states = Link.objects.filter(from_job_id=job.pk).values_list("to_job_id", "to_job__state")
    return _wait(sorted(i for i, state in states if not met(state, job.dependency)), job.dependency)


def record(*, job: Job, depends_on: tuple[int, ...]) -> None:
    Link.objects.bulk_create([Link(from_job_id=job.pk, to_job_id=other) for other in depends_on])


def unmet_among(job_ids: Iterable[int]) -> set[int]:
    """Those of these (queued) jobs whose dependencies are not met yet: not to be offered.

    The pass reads every queued job's `dependency` with the rest of its row and asks only about
    the ones that have some, so a queue without dependencies costs no query at all (a correlated
    `NOT EXISTS` in the pending query made PostgreSQL estimate it high enough to JIT-compile it,
    +20-35 ms per pass on the scale bench's 10,000 jobs)."""
    ids = list(job_ids)
    if not ids:
        return set()
    not_met = (Q(from_job__dependency=Dependency.AFTER_OK) & ~Q(to_job__state=JobState.COMPLETED)) | (
        Q(from_job__dependency=Dependency.AFTER_ANY) & ~Q(to_job__state__in=TERMINAL_JOB_STATES)
    )
    return set(Link.objects.filter(not_met, from_job_id__in=ids).values_list("from_job_id", flat=True))


def last_ended(job_ids: Iterable[int]) -> dict[int, datetime]:
    """When each job's last dependency ended, for those of `job_ids` that have dependencies (ids
    of jobs without any may be passed; they are left out): aging starts there, not at submission.
    A separate query over the few such jobs keeps a correlated subquery out of the pass's load."""
    ids = list(job_ids)
    if not ids:
        return {}
    return dict(
        Link.objects.filter(from_job_id__in=ids)
        .values("from_job_id")
        .annotate(last=Max("to_job__finished_at"))
        .filter(last__isnull=False)
        .values_list("from_job_id", "last")
    )


def waiting_afterok(job_id: int) -> list[int]:
    """Queued `afterok` jobs that wait for this one (cancelled when it ends unsuccessfully)."""
    return list(
        Job.objects.filter(depends_on=job_id, state=JobState.QUEUED, dependency=Dependency.AFTER_OK)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def orphaned_afterok() -> list[tuple[int, int]]:
    """(job, dependency) for queued `afterok` jobs one of whose dependencies ended unsuccessfully."""
    return list(
        Link.objects.filter(
            from_job__state=JobState.QUEUED, from_job__dependency=Dependency.AFTER_OK,
            to_job__state__in=UNSUCCESSFUL,
        )
        .order_by("from_job_id", "to_job_id")
        .values_list("from_job_id", "to_job_id")
    )
