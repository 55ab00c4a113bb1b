"""Who may read a budget, and the member route's user id: budgets/api/views.py."""

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from accounts.models import OrgRole
from budgets.models import Budget
from budgets.services import set_budget
from tests.api.conftest import client_for
from tests.api.factories import Tenant, make_tenant
from tests.factories import MembershipFactory, OrgMembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def budgeted(fleet: dict) -> Tenant:
    tenant = make_tenant(funds=10**9)
    set_budget(org=tenant.org, period="month", limit=10**12, enforcement="soft")
    set_budget(org=tenant.org, project=tenant.project, period="month", limit=10**11, enforcement="soft")
    set_budget(org=tenant.org, project=tenant.project, user=tenant.user, period="month", limit=10**10,
               enforcement="soft")
    return tenant


def _urls(t: Tenant) -> dict[str, str]:
    return {"org": f"/api/v1/orgs/{t.org.pk}/budget", "project": f"/api/v1/projects/{t.project.pk}/budget",
            "member": f"/api/v1/projects/{t.project.pk}/members/{t.user.pk}/budget"}


def test_a_project_only_member_gets_403_on_every_budget_like_the_org_balance(budgeted: Tenant) -> None:
    """QA: a project-only member read the org's held and spent at GET /orgs/{id}/budget while
    /orgs/{id}/balance answered them 403. Reading a project's or another member's budget is for org
    owners/admins (docs/api.md), so their own project's is 403 too; their own budget they read
    (QA, session 18: a member refused `budget-exceeded` could not see it)."""
    member = client_for(budgeted.user)
    assert member.get(f"/api/v1/orgs/{budgeted.org.pk}/balance").status_code == 403
    own = member.get(_urls(budgeted)["member"])
    assert own.status_code == 200 and own.json()["limit"] == 10**10
    for level in ("org", "project"):
        url = _urls(budgeted)[level]
        response = member.get(url)
        assert response.status_code == 403, (level, response.content)
        assert response.json()["type"] == "permission-denied"
        assert "limit" not in response.json() and "current_period" not in response.json()
    # QA: the org budget's refusal named "its balance and journal", not what was asked
    refused = member.get(_urls(budgeted)["org"]).json()["detail"]
    assert refused == "Only members of the organization may read its budget."


def test_an_org_member_reads_the_org_budget_and_only_managers_read_the_others(budgeted: Tenant) -> None:
    viewer = UserFactory()
    OrgMembershipFactory(org=budgeted.org, user=viewer, role=OrgRole.VIEWER)
    reader = client_for(viewer)
    assert reader.get(f"/api/v1/orgs/{budgeted.org.pk}/balance").status_code == 200
    urls = _urls(budgeted)
    assert reader.get(urls["org"]).status_code == 200  # what the balance route requires
    assert reader.get(urls["project"]).status_code == 403
    assert reader.get(urls["member"]).status_code == 403
    finance_user = UserFactory()
    finance_user.groups.add(Group.objects.get_or_create(name="finance")[0])
    for caller in (client_for(budgeted.admin), client_for(finance_user)):
        limits = [caller.get(url).json()["limit"] for url in urls.values()]
        assert limits == [10**12, 10**11, 10**10]


def test_a_member_is_not_told_who_else_is_a_member(budgeted: Tenant) -> None:
    """The member route checks the caller before it looks the user up: a project member who may
    not read or set others' budgets gets 403 for a member and a stranger alike, not 200/404; they
    read their own budget but do not set it."""
    member = client_for(budgeted.user)
    stranger = UserFactory()
    other = UserFactory()
    MembershipFactory(project=budgeted.project, user=other)
    for user_id in (budgeted.user.pk, other.pk, stranger.pk, 2**63):
        url = f"/api/v1/projects/{budgeted.project.pk}/members/{user_id}/budget"
        assert member.get(url).status_code == (200 if user_id == budgeted.user.pk else 403)
        put = member.put(url, {"period": "month", "limit": 1, "enforcement": "hard"}, format="json",
                         HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
        assert put.status_code == 403


@pytest.mark.parametrize("user_id", [2**31, 2**63 - 1, 2**63, 2**64, 10**30])
def test_a_user_id_beyond_any_user_is_404_on_get_and_put(budgeted: Tenant, user_id: int) -> None:
    """QA: 2**63 and beyond was a 500 (OverflowError on SQLite; PostgreSQL refuses the value as
    out of range for bigint). The embedded-mode test runs the same request on SQLite."""
    admin: APIClient = client_for(budgeted.admin)
    url = f"/api/v1/projects/{budgeted.project.pk}/members/{user_id}/budget"
    responses: list[Any] = [
        admin.get(url),
        admin.put(url, {"period": "month", "limit": 1, "enforcement": "hard"}, format="json",
                  HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex),
    ]
    for response in responses:
        assert response.status_code == 404, response.content
        assert response.json()["type"] == "not-found"
        assert response.json()["detail"].startswith(f"User {user_id} is not a member of project")
    assert Budget.objects.count() == 3
