"""Who may see what in the browser: orgs and projects a user belongs to, and dashboard scope."""

from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Q

from accounts.models import Membership, Organization, OrgMembership, OrgRole, Project

FINANCE_GROUP = "finance"
ORG_MANAGER_ROLES = (OrgRole.OWNER, OrgRole.ADMIN)

AnyUser = AbstractBaseUser | AnonymousUser


@dataclass(frozen=True)
class OrgView:
    """One organization as a user may see it: the whole org, or only some of its projects."""

    org: Organization
    role: str  # the org role, or "" for a member of projects only
    projects: list[Project] = field(default_factory=list)

    @property
    def sees_whole_org(self) -> bool:
        return bool(self.role)


def visible_orgs(user: AnyUser) -> list[OrgView]:
    """Orgs the user is a member of (whole org) or has projects in (those projects only)."""
    if not user.is_authenticated:
        return []
    roles = dict(OrgMembership.objects.filter(user=user).values_list("org_id", "role"))
    member_project_ids = set(Membership.objects.filter(user=user).values_list("project_id", flat=True))
    orgs = Organization.objects.filter(
        Q(id__in=roles.keys()) | Q(projects__id__in=member_project_ids)
    ).distinct().order_by("name", "id")
    projects_by_org: dict[int, list[Project]] = {}
    for project in Project.objects.filter(org__in=orgs).order_by("name", "id"):
        if project.org_id in roles or project.id in member_project_ids:
            projects_by_org.setdefault(project.org_id, []).append(project)
    return [
        OrgView(org=org, role=roles.get(org.id, ""), projects=projects_by_org.get(org.id, []))
        for org in orgs
    ]


def org_view_for(user: AnyUser, slug: str) -> OrgView | None:
    """The user's view of one org by slug, or None when they do not belong to it."""
    return next((view for view in visible_orgs(user) if view.org.slug == slug), None)


@dataclass(frozen=True)
class DashboardScope:
    """What the live dashboard shows a user: every org (finance/staff) or the orgs they manage."""

    all_orgs: bool
    org_ids: frozenset[int]

    def allows(self, org_id: int) -> bool:
        return self.all_orgs or org_id in self.org_ids


def dashboard_scope(user: AnyUser) -> DashboardScope | None:
    """None when the user may not open the dashboard at all."""
    if not user.is_authenticated or not user.is_active:
        return None
    if user.is_staff or user.is_superuser or user.groups.filter(name=FINANCE_GROUP).exists():
        return DashboardScope(all_orgs=True, org_ids=frozenset())
    managed = frozenset(
        OrgMembership.objects.filter(user=user, role__in=ORG_MANAGER_ROLES).values_list(
            "org_id", flat=True
        )
    )
    if not managed:
        return None
    return DashboardScope(all_orgs=False, org_ids=managed)
