"""Pricing and placing a job's hold: budgets at every level, then the funds (DESIGN.md §4-§6)."""

from datetime import datetime

from django.db import transaction

from budgets.services import precheck_budgets, reserve_budgets
from config.clock import db_now
from config.errors import DomainError
from ledger.models import Hold
from ledger.services import CallerEvent, place_hold
from scheduling.models import Job
from scheduling.pricing import Catalog, catalog_knowing, hold_amount


class NoEligibleGpuType(DomainError):
    """None of the job's acceptable GPU types meets its per-GPU memory floor."""

    type = "validation-error"
    status = 400
    title = "No acceptable GPU type"


def eligible_types(gpu_types: list[str], gpu_memory_gb: int, snap: Catalog | None = None) -> list[str]:
    """The acceptable types (in preference order) whose memory meets the per-GPU floor."""
    memory = (snap or catalog_knowing(gpu_types=gpu_types)).memory_gb
    eligible = [name for name in gpu_types if memory.get(name, -1) >= gpu_memory_gb]
    if not eligible:
        raise NoEligibleGpuType(
            f"No GPU type in {gpu_types} has {gpu_memory_gb} GB per GPU.",
            errors={"gpu_memory_gb": ["No acceptable GPU type has this much memory per GPU."]},
        )
    return eligible


def eligible_gpu_types(job: Job) -> list[str]:
    """The job's acceptable types (in preference order) whose memory meets its floor."""
    return eligible_types(list(job.gpu_types), job.gpu_memory_gb)


def hold_seconds(job: Job) -> int:
    """Max wall time, or the org's hold window when that is shorter (renewed as the job runs)."""
    window = job.org.hold_window_seconds
    return min(job.max_wall_seconds, window) if window else job.max_wall_seconds


def price_job_hold(job: Job, gpu_types: list[str] | None = None, at: datetime | None = None) -> int:
    return hold_amount(
        gpu_types=gpu_types or eligible_gpu_types(job), gpu_count=job.gpu_count,
        seconds=hold_seconds(job), at=at,
    )


def place_job_hold(
    *, job: Job, key: str, types: list[str], amount: int, now: datetime, fresh: bool = False,
    audit_as: CallerEvent | None = None,
) -> Hold:
    """Lock and check every budget level, hold the funds, count the hold in the budgets.

    `fresh`: the hold cannot exist yet (its job was inserted by this same transaction), so the
    budget charges need no replay lookup, and the placement needs no savepoint (a refusal fails
    the submission). Lock order: the caller holds the job; budget periods
    (org, project, member) are locked here before `place_hold` locks buckets. Raises
    BudgetExceeded or InsufficientCredits. `audit_as`: the placement's audit event is the caller's
    (see `ledger.place_hold`). `types` come from the catalog (`eligible_types`): already checked.
    """
    prechecked = precheck_budgets(org=job.org, project=job.project, user=job.user, amount=amount, now=now)
    hold = place_hold(
        org=job.org, amount=amount, key=key, project=job.project, user=job.user,
        gpu_types=types, reference=f"job:{job.pk}", actor=job.user, audit_as=audit_as,
        gpu_types_checked=True, savepoint=not fresh,
    )
    reserve_budgets(hold=hold, org=job.org, project=job.project, user=job.user, amount=amount,
                    prechecked=prechecked, fresh=fresh)
    return hold


@transaction.atomic(savepoint=False)
def reserve_job_hold(*, job: Job, key: str) -> Hold:
    """Price the job's hold, check every budget level, then hold the funds; idempotent by key.

    Lock order: the caller holds the job; budget periods (org, project, member) are locked and
    checked here before `place_hold` locks buckets. Raises BudgetExceeded or InsufficientCredits.
    """
    existing = Hold.objects.filter(org_id=job.org_id, key=key).first()
    if existing is not None:
        return existing
    now = db_now()
    types = eligible_gpu_types(job)
    amount = price_job_hold(job, types, at=now)
    return place_job_hold(job=job, key=key, types=types, amount=amount, now=now)
