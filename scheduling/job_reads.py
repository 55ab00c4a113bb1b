"""Which jobs a user may read, and one job's detail in a fixed number of queries: what the API's
`GET /jobs/{id}` and the portal's job page both show, so their figures cannot differ."""

from __future__ import annotations

from typing import Any

from django.db.models import OuterRef, Prefetch, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce

from accounts.selectors import visible_projects
from scheduling.models import Job, JobAttempt, JobRefund

# What a job's detail shows of its attempts: type, the charge (its hold), the nodes it ran on.
ATTEMPT_DETAIL = (
    Prefetch("attempts", queryset=JobAttempt.objects.select_related("gpu_type", "hold")
             .prefetch_related("allocations__node").order_by("number")),
)


def with_refunded(jobs: QuerySet[Job]) -> QuerySet[Job]:
    """The detail's `refunded`, in the job's own query (no query more per detail)."""
    total = JobRefund.objects.filter(job_id=OuterRef("pk")).order_by().values("job_id").annotate(
        total=Sum("amount")).values("total")
    return jobs.annotate(refunded_total=Coalesce(Subquery(total), 0))


def visible_jobs(user: Any) -> QuerySet[Job]:
    """Jobs of the projects the user sees (docs/api.md: "project visible")."""
    return (
        Job.objects.filter(project__in=visible_projects(user))
        .select_related("priority_class", "current_hold")
        .prefetch_related("depends_on")
    )


def job_detail(user: Any, job_id: int, jobs: QuerySet[Job] | None = None) -> Job | None:
    """The job with its attempts (their holds and nodes) and `refunded_total`; None when the user
    may not see it (or there is no such job)."""
    found = with_refunded(visible_jobs(user) if jobs is None else jobs).prefetch_related(*ATTEMPT_DETAIL)
    return found.filter(pk=job_id).first()
