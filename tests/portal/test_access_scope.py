"""portal.access: dashboard scope and visible orgs, directly (mutation testing round 2)."""

import pytest
from django.contrib.auth.models import Group

from accounts.models import OrgRole
from portal.access import FINANCE_GROUP, dashboard_scope, visible_orgs
from tests.factories import (
    MembershipFactory,
    OrganizationFactory,
    OrgMembershipFactory,
    ProjectFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


def test_another_group_is_not_finance() -> None:
    org, other = OrganizationFactory(), OrganizationFactory()
    user = UserFactory()
    user.groups.add(Group.objects.create(name="support"))
    OrgMembershipFactory(org=org, user=user, role=OrgRole.ADMIN)
    scope = dashboard_scope(user)
    assert scope is not None and not scope.all_orgs
    assert scope.allows(org.pk) and not scope.allows(other.pk)
    user.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    assert dashboard_scope(user).all_orgs


def test_a_member_of_another_group_only_gets_no_dashboard() -> None:
    user = UserFactory()
    user.groups.add(Group.objects.create(name="support"))
    assert dashboard_scope(user) is None


@pytest.mark.parametrize("kind", ["staff", "finance", "admin"])
def test_a_deactivated_user_gets_no_dashboard(kind: str) -> None:
    user = UserFactory(is_staff=kind == "staff")
    if kind == "finance":
        user.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    if kind == "admin":
        OrgMembershipFactory(org=OrganizationFactory(), user=user, role=OrgRole.OWNER)
    assert dashboard_scope(user) is not None
    user.is_active = False
    user.save()
    assert dashboard_scope(user) is None


def test_a_project_member_sees_only_their_projects_and_not_the_whole_org() -> None:
    org, elsewhere = OrganizationFactory(), OrganizationFactory()
    mine, theirs = ProjectFactory(org=org), ProjectFactory(org=org)
    ProjectFactory(org=elsewhere)
    user = UserFactory()
    MembershipFactory(project=mine, user=user)
    (view,) = visible_orgs(user)
    assert view.org == org and view.role == "" and not view.sees_whole_org
    assert view.projects == [mine] and theirs not in view.projects
