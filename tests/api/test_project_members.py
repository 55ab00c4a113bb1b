"""POST /projects/{id}/members: only people of the project's org can be added, and adding someone
again with the role they have changes nothing and writes no event."""

import itertools
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import Membership, OrgRole
from accounts.services import AccountsError, add_project_member
from audit.models import AuditEvent
from tests.api.concurrency import run_concurrently
from tests.api.conftest import client_for
from tests.api.factories import Tenant, add_member, make_tenant
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


def _events(membership: Membership) -> list[tuple[str, dict[str, Any]]]:
    rows = AuditEvent.objects.filter(subject_type="membership", subject_id=str(membership.pk)).order_by("seq")
    return [(e.action, e.data) for e in rows]


def test_adding_again_with_the_same_role_changes_nothing(tenant: Tenant) -> None:
    """QA: each repeated add answered 200 and wrote an `accounts.member.role` event though nothing
    changed; the role event did not say what the role had been."""
    newcomer = UserFactory()
    OrgMembershipFactory(org=tenant.org, user=newcomer)
    admin, p, u = client_for(tenant.admin), tenant.project.pk, newcomer.pk

    def outcome(role: str) -> tuple[int, str, bool | None]:
        response = add(admin, p, {"user": u, "role": role})
        return response.status_code, response.json()["role"], response.json().get("unchanged")

    assert outcome("member") == (201, "member", False)
    assert outcome("member") == (200, "member", True)
    assert outcome("viewer") == (200, "viewer", False)
    assert outcome("viewer") == (200, "viewer", True)
    membership = Membership.objects.get(project=tenant.project, user=newcomer)
    assert _events(membership) == [
        ("accounts.member.add", {"project": p, "user": u, "role": "member"}),
        ("accounts.member.role", {"project": p, "user": u, "role": "viewer", "previous_role": "member"}),
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_concurrent_adds_write_one_event_per_change(fleet: dict) -> None:
    """QA: six concurrent adds with one role wrote one `add` and five `role` events. Real threads:
    one adds, the others find the role unchanged; with two roles racing, each `role` event starts
    from the role the one before it left."""
    tenant = make_tenant()
    admin = client_for(tenant.admin)
    same, mixed = UserFactory(), UserFactory()
    for user in (same, mixed):
        OrgMembershipFactory(org=tenant.org, user=user)

    def call(user: Any, role: str) -> Callable[[], tuple[int, bool | None]]:
        def post() -> tuple[int, bool | None]:
            response = add(admin, tenant.project.pk, {"user": user.pk, "role": role})
            return response.status_code, response.json().get("unchanged")
        return post

    results = run_concurrently([call(same, "member") for _ in range(6)])
    assert [action for action, _ in _events(Membership.objects.get(user=same))] == ["accounts.member.add"]
    assert sorted(results) == [(200, True)] * 5 + [(201, False)]

    roles = ["member", "viewer", "viewer"] * 4  # the project roles (owner and admin are refused)
    results = run_concurrently([call(mixed, role) for role in roles])
    assert sorted(status for status, _ in results) == [200] * 11 + [201]
    membership = Membership.objects.get(user=mixed)
    events = _events(membership)
    assert events[0][0] == "accounts.member.add"
    assert len(events) == 1 + sum(status == 200 and not unchanged for status, unchanged in results)
    for (_, before), (action, after) in itertools.pairwise(events):
        assert action == "accounts.member.role"
        assert after["previous_role"] == before["role"] != after["role"]
    assert events[-1][1]["role"] == membership.role


@pytest.mark.parametrize("role", ["owner", "admin", "superuser"])
def test_org_roles_are_refused_on_a_project(tenant: Tenant, role: str) -> None:
    """QA: `"role": "owner"` (or "admin") was accepted with a 200, and gave nothing: owner and admin
    are organization roles, and the project member still got 403 on what owners and admins do."""
    member = add_member(tenant.project)
    response = add(client_for(tenant.admin), tenant.project.pk, {"user": member.pk, "role": role})
    assert response.status_code == 400, response.json()
    assert response.json()["errors"] == {"role": [
        f'"{role}" is not a project role. A project role is member or viewer; owner and admin are '
        "organization roles (an org membership, given in the admin)."]}
    assert Membership.objects.get(project=tenant.project, user=member).role == OrgRole.MEMBER
    with pytest.raises(AccountsError, match="Not a project role") as refused:
        add_project_member(project=tenant.project, user=member, role=role, actor=tenant.admin)
    assert refused.value.extra == {"field": "role"}
    assert not AuditEvent.objects.filter(action="accounts.member.role").exists()


def test_a_membership_given_an_org_role_before_stays_readable_and_can_be_changed(tenant: Tenant) -> None:
    """Rows given owner/admin before the rule keep them (the column's choices are unchanged, no data
    migration): listed as they are, acting as a member, and changed to a project role as usual."""
    legacy = add_member(tenant.project, OrgRole.OWNER)
    url = f"/api/v1/projects/{tenant.project.pk}/members"
    rows = {row["user"]: row["role"] for row in client_for(tenant.admin).get(url).json()["results"]}
    assert rows[legacy.pk] == "owner"
    response = add(client_for(tenant.admin), tenant.project.pk, {"user": legacy.pk, "role": "viewer"})
    body = response.json()
    assert (response.status_code, body["role"], body["unchanged"]) == (200, "viewer", False)
