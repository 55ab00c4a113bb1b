"""Job submission: validate, create the job `queued`, reserve its hold — one transaction."""

import logging
from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from accounts.models import Project, Region
from accounts.selectors import can_submit
from audit.services import record
from config.clock import db_now
from config.errors import DomainError
from scheduling.models import GpuType, Job, JobState, PriorityClass
from scheduling.services.reservation import reserve_job_hold

logger = logging.getLogger(__name__)


class SubmissionInvalid(DomainError):
    """The spec names things that do not exist or breaks a policy (per-field `errors`)."""

    type = "validation-error"
    status = 400
    title = "Invalid job"

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("The job specification is invalid.", errors=errors)


class SubmissionForbidden(DomainError):
    type = "permission-denied"
    status = 403
    title = "Permission denied"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a client asks for (already shape-checked by the API serializer)."""

    name: str
    gpu_types: tuple[str, ...]
    gpu_count: int
    max_wall_seconds: int
    priority_class: str
    gpu_memory_gb: int = 0
    preemptible: bool | None = None  # None: the priority class decides
    command: str = ""
    regions: tuple[str, ...] = field(default_factory=tuple)


def _validate(spec: JobSpec) -> tuple[PriorityClass, bool]:
    errors: dict[str, list[str]] = {}
    known = set(GpuType.objects.filter(name__in=spec.gpu_types).values_list("name", flat=True))
    if unknown := [name for name in spec.gpu_types if name not in known]:
        errors["gpu_types"] = [f"Unknown GPU type {name!r}." for name in unknown]
    if len(set(spec.gpu_types)) != len(spec.gpu_types):
        errors.setdefault("gpu_types", []).append("GPU types must not repeat.")
    if spec.regions:
        codes = set(Region.objects.filter(code__in=spec.regions).values_list("code", flat=True))
        if missing := [code for code in spec.regions if code not in codes]:
            errors["regions"] = [f"Unknown region {code!r}." for code in missing]
    cls = PriorityClass.objects.filter(name=spec.priority_class).first()
    preemptible = True
    if cls is None:
        errors["priority_class"] = [f"Unknown priority class {spec.priority_class!r}."]
    else:
        preemptible = cls.preemptible if spec.preemptible is None else spec.preemptible
        # Opting out of preemption is a privilege of non-preemptible classes (e.g. production):
        # otherwise any batch job could pin GPUs that higher classes are entitled to reclaim.
    if errors:
        raise SubmissionInvalid(errors)
    assert cls is not None
    if not preemptible and cls.preemptible:
        raise SubmissionForbidden(
            f"Priority class {cls.name!r} is preemptible; only jobs of a non-preemptible class "
            "(e.g. production) may opt out of preemption.", field="preemptible",
        )
    return cls, preemptible


def _schedule_soon() -> None:
    """Ask the scheduler for an early pass (after commit); never fails the submission."""
    try:
        from scheduling.tasks import schedule_soon
    except ImportError:
        return
    try:
        schedule_soon()
    except Exception:  # a lost trigger only delays placement until the next beat tick
        logger.warning("schedule_soon trigger failed", exc_info=True)


@transaction.atomic
def submit_job(*, user: Any, project: Project, spec: JobSpec, idempotency_key: str) -> Job:
    """Validate, create the job `queued`, price and place its hold (budgets + funds), audit.

    The API makes this exactly-once per (caller, Idempotency-Key) by committing its idempotency
    record in this same transaction; the key is also kept on the audit event.
    Raises SubmissionInvalid, SubmissionForbidden, BudgetExceeded or InsufficientCredits.
    """
    if not can_submit(user, project):
        raise SubmissionForbidden("Only project members (or org owners/admins) may submit jobs here.")
    cls, preemptible = _validate(spec)
    job = Job.objects.create(
        org_id=project.org_id, project=project, user=user, name=spec.name,
        gpu_types=list(spec.gpu_types), gpu_count=spec.gpu_count, gpu_memory_gb=spec.gpu_memory_gb,
        max_wall_seconds=spec.max_wall_seconds, priority_class=cls, preemptible=preemptible,
        command=spec.command, regions=list(spec.regions), state=JobState.QUEUED,
        submitted_at=db_now(),
    )
    job.org = project.org
    hold = reserve_job_hold(job=job, key=f"job:{job.pk}:submit")
    Job.objects.filter(pk=job.pk).update(current_hold=hold, estimate=hold.authorized)
    job.current_hold, job.estimate = hold, hold.authorized
    record(
        action="sched.job.submit", subject_type="job", subject_id=job.pk, org_id=job.org_id,
        actor_type="user", actor_id=str(user.pk), amount=hold.authorized, reason_code="submitted",
        data={"project": project.pk, "hold": hold.pk, "idempotency_key": idempotency_key[:255],
              "gpu_types": list(spec.gpu_types), "gpu_count": spec.gpu_count},
    )
    transaction.on_commit(_schedule_soon)
    return job
