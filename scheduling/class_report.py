"""Which priority classes a caller's organizations may use (the API's `/priority-classes`)."""

from __future__ import annotations

from typing import Any

from accounts.selectors import member_orgs
from scheduling.models import PriorityClass, PriorityGrant


def priority_classes_for(user: Any) -> list[dict[str, Any]]:
    """Every class, highest first, with the caller's orgs (those they belong to, by an org role or
    a project membership) that may submit jobs of it: all of them, or for a restricted class
    those granted it."""
    mine = sorted(member_orgs(user).values_list("pk", flat=True))
    granted: dict[int, set[int]] = {}
    grants = PriorityGrant.objects.filter(org_id__in=mine).values_list("priority_class_id", "org_id")
    for class_id, org_id in grants:
        granted.setdefault(class_id, set()).add(org_id)
    return [
        {"name": cls.name, "rank": cls.rank, "preemptible": cls.preemptible, "can_preempt": cls.can_preempt,
         "restricted": cls.restricted,
         "your_orgs": sorted(granted.get(cls.pk, ())) if cls.restricted else mine}
        for cls in PriorityClass.objects.order_by("-rank")
    ]
