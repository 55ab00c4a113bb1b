"""Who may use a restricted priority class (docs/scheduler.md, "Who may use a class")."""

from __future__ import annotations

from django.db.models import Exists, OuterRef, Q

from scheduling.models import PriorityGrant


def class_not_granted() -> Q:
    """Jobs whose priority class is restricted and whose org holds no grant of it (revoked since
    the job was submitted, or the class restricted since)."""
    granted = PriorityGrant.objects.filter(
        org_id=OuterRef("org_id"), priority_class_id=OuterRef("priority_class_id"))
    return Q(priority_class__restricted=True) & ~Exists(granted)
