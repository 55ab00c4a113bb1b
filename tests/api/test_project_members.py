"""POST /projects/{id}/members: only people of the project's org can be added, and adding someone
again with the role they have changes nothing and writes no event."""

import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import Membership, OrgRole
from accounts.services import AccountsError, add_project_member
from tests.api.conftest import client_for
from tests.api.factories import Tenant, make_tenant
from tests.factories import OrgMembershipFactory, ProjectFactory, UserFactory

pytestmark = pytest.mark.django_db


def add(client: APIClient, project_id: int, body: dict[str, Any]) -> Any:
    return client.post(f"/api/v1/projects/{project_id}/members", body, format="json",
                       HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)


def refusal(response: Any) -> tuple[int, str, str, Any]:
    problem = response.json()
    return response.status_code, problem.get("type"), problem.get("detail"), problem.get("errors")


NO_SUCH_USER = (400, "validation-error", "The request has invalid fields.",
                {"user": ["No such active user."]})


def test_users_outside_the_org_are_answered_like_unknown_ones(tenant: Tenant) -> None:
    """QA: an org owner could add any active user of the platform, and the 201 showed their
    username (another org's "admin"): users could be enumerated across orgs."""
    other = make_tenant()
    loner = UserFactory()  # belongs to no org at all
    admin = client_for(tenant.admin)
    for body in ({"username": other.admin.username}, {"user": other.user.pk}, {"username": loner.username},
                 {"user": loner.pk}, {"username": "nobody-at-all"}, {"user": 10**9}):
        response = add(admin, tenant.project.pk, body)
        assert refusal(response) == NO_SUCH_USER, (body, response.json())
        assert other.admin.username not in response.content.decode()
    assert not Membership.objects.filter(project=tenant.project).exclude(user=tenant.user).exists()


def test_an_inactive_member_of_the_org_is_not_found_either(tenant: Tenant) -> None:
    gone = UserFactory(is_active=False)
    OrgMembershipFactory(org=tenant.org, user=gone)
    assert refusal(add(client_for(tenant.admin), tenant.project.pk, {"user": gone.pk})) == NO_SUCH_USER


@pytest.mark.parametrize("how", ["org-membership", "other-project"])
def test_people_of_the_org_can_be_added(tenant: Tenant, how: str) -> None:
    """Someone joins an org through the admin (an org membership, or a membership of one of its
    projects) or as the owner it is created with; after that the API can add them to its projects."""
    newcomer = UserFactory()
    if how == "org-membership":
        OrgMembershipFactory(org=tenant.org, user=newcomer, role=OrgRole.VIEWER)
    else:
        Membership.objects.create(project=ProjectFactory(org=tenant.org), user=newcomer)
    response = add(client_for(tenant.admin), tenant.project.pk, {"username": newcomer.username,
                                                                 "role": "member"})
    assert response.status_code == 201, response.json()
    assert (response.json()["user"], response.json()["username"]) == (newcomer.pk, newcomer.username)
    assert Membership.objects.get(project=tenant.project, user=newcomer).role == OrgRole.MEMBER


def test_the_service_refuses_someone_outside_the_org(tenant: Tenant) -> None:
    stranger = make_tenant().user
    with pytest.raises(AccountsError, match="No such active user"):
        add_project_member(project=tenant.project, user=stranger, actor=tenant.admin)
    assert not Membership.objects.filter(user=stranger, project=tenant.project).exists()
