"""API test tenants built on the shared factories (tests/factories.py)."""

from dataclasses import dataclass
from typing import Any

from accounts.models import Organization, OrgRole, Project
from tests.factories import (
    MembershipFactory,
    OrganizationFactory,
    OrgMembershipFactory,
    ProjectFactory,
    UserFactory,
    fund,
)


@dataclass
class Tenant:
    org: Organization
    project: Project
    user: Any  # a project member who may submit
    admin: Any  # the org's admin


def make_tenant(*, funds: int = 0, inflight: int = 1000, **org_fields: Any) -> Tenant:
    org = OrganizationFactory(max_inflight_submissions=inflight, **org_fields)
    project = ProjectFactory(org=org)
    user = UserFactory()
    MembershipFactory(project=project, user=user, role=OrgRole.MEMBER)
    admin = UserFactory()
    OrgMembershipFactory(org=org, user=admin, role=OrgRole.ADMIN)
    if funds:
        fund(org, funds)
    return Tenant(org=org, project=project, user=user, admin=admin)


def grant(org: Organization, class_name: str = "production") -> None:
    """Let `org` submit jobs of a restricted priority class."""
    from scheduling.models import PriorityClass, PriorityGrant

    PriorityGrant.objects.get_or_create(org=org, priority_class=PriorityClass.objects.get(name=class_name))


def add_member(project: Project, role: str = OrgRole.MEMBER) -> Any:
    user = UserFactory()
    MembershipFactory(project=project, user=user, role=role)
    return user
