"""Who may use a restricted priority class (docs/scheduler.md, "Who may use a class")."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q

from scheduling.core import reasons
from scheduling.models import Job, PriorityGrant


def class_not_granted() -> Q:
    """Jobs whose priority class is restricted and whose org holds no grant of it (revoked since
    the job was submitted, or the class restricted since)."""
    granted = PriorityGrant.objects.filter(
        org_id=OuterRef("org_id"), priority_class_id=OuterRef("priority_class_id"))
    return Q(priority_class__restricted=True) & ~Exists(granted)


def not_granted_detail(klass: str, org: str) -> str:
    return (f"priority class {klass} is no longer granted to {org}: an administrator may grant it again, "
            "or cancel the job and submit it in another class")


def not_granted_wait(job_id: int) -> tuple[str, str] | None:
    """`class-not-granted` and its detail when the queued job's org may not use its class now."""
    row = (Job.objects.filter(pk=job_id).filter(class_not_granted())
           .values_list("priority_class__name", "org__name").first())
    return None if row is None else (reasons.CLASS_NOT_GRANTED, not_granted_detail(*row))
