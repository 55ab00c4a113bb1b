"""QA: API users could not discover the ids other routes take: `GET /orgs/{id}/projects` and
`GET /projects/{id}/members` were 405s, and the job list's `user` filter took an id only
(`?user=alice` was a 400 "A valid integer is required."; Slurm's `sacct -u` takes usernames)."""

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from accounts.models import Membership, OrgRole
from tests.api.conftest import client_for
from tests.api.factories import Tenant, add_member, make_tenant
from tests.api.test_job_dependencies import submit
from tests.factories import OrgMembershipFactory, ProjectFactory, UserFactory

pytestmark = pytest.mark.django_db


def finance_user() -> Any:
    user = UserFactory()
    user.groups.add(Group.objects.get_or_create(name="finance")[0])
    return user


def slugs(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [project["slug"] for project in response.json()["results"]]


def test_org_projects_are_listed_to_whoever_sees_them(tenant: Tenant) -> None:
    second = ProjectFactory(org=tenant.org, slug="second")
    ProjectFactory(org=make_tenant().org, slug="elsewhere")  # another org's: never listed
    viewer = UserFactory()
    OrgMembershipFactory(org=tenant.org, user=viewer, role=OrgRole.VIEWER)
    everything = [tenant.project.slug, "second"]
    url = f"/api/v1/orgs/{tenant.org.pk}/projects"
    for who in (tenant.admin, viewer, finance_user()):  # any org role, and finance: every project
        assert slugs(client_for(who).get(url)) == everything
    # A member of projects only sees the org's existence and their own projects, not the others.
    assert slugs(client_for(tenant.user).get(url)) == [tenant.project.slug]
    loner = add_member(second)
    assert slugs(client_for(loner).get(url)) == ["second"]
    body = client_for(tenant.admin).get(url, {"page_size": 1}).json()
    assert (body["count"], len(body["results"]), body["next"] is not None) == (2, 1, True)
    assert body["results"][0] == {"id": tenant.project.pk, "org": tenant.org.pk, "name": tenant.project.name,
                                  "slug": tenant.project.slug, "fair_share_weight": 1,
                                  "created_at": body["results"][0]["created_at"]}


def test_org_projects_of_an_org_out_of_sight_or_with_bad_query_are_refused(tenant: Tenant) -> None:
    other = make_tenant()
    assert client_for(tenant.admin).get(f"/api/v1/orgs/{other.org.pk}/projects").status_code == 404
    response = client_for(tenant.admin).get(f"/api/v1/orgs/{tenant.org.pk}/projects", {"slug": "x"})
    assert response.status_code == 400 and response.json()["errors"] == {"slug": ["Unknown query parameter."]}


def test_project_members_are_listed_with_their_ids(tenant: Tenant) -> None:
    viewer = add_member(tenant.project, OrgRole.VIEWER)
    expected = [{"id": m.pk, "project": tenant.project.pk, "user": m.user_id, "username": m.user.username,
                 "role": m.role} for m in Membership.objects.filter(project=tenant.project).order_by("id")]
    assert [row["user"] for row in expected] == [tenant.user.pk, viewer.pk]
    org_viewer = UserFactory()
    OrgMembershipFactory(org=tenant.org, user=org_viewer, role=OrgRole.VIEWER)
    url = f"/api/v1/projects/{tenant.project.pk}/members"
    # Its members (a viewer too), the org's people (who read every project's members by id and
    # username in /orgs/{id}/fair-share already) and finance.
    for who in (tenant.user, viewer, tenant.admin, org_viewer, finance_user()):
        response = client_for(who).get(url)
        assert response.status_code == 200, response.content
        assert response.json()["results"] == expected
        assert response.json()["count"] == 2
    # The ids are the ones the per-member budget route takes.
    budget_url = f"/api/v1/projects/{tenant.project.pk}/members/{expected[1]['user']}/budget"
    budget = client_for(tenant.admin).get(budget_url)
    assert "is not a member of project" not in budget.content.decode(), budget.content


def test_project_members_are_not_found_outside_tenancy(tenant: Tenant) -> None:
    other = make_tenant()
    url = f"/api/v1/projects/{tenant.project.pk}/members"
    for who in (other.admin, other.user):
        assert client_for(who).get(url).status_code == 404
    # A member of another project of the same org does not see this project, nor its members.
    outsider = add_member(ProjectFactory(org=tenant.org))
    response = client_for(outsider).get(url)
    assert response.status_code == 404 and tenant.user.username not in response.content.decode()


def names(client: APIClient, **query: str) -> list[str]:
    response = client.get(f"/api/v1/jobs?{urlencode(query)}")
    assert response.status_code == 200, response.content
    return sorted(job["name"] for job in response.json()["results"])


def test_jobs_filter_by_username_as_by_id(api: APIClient, job_body: Callable, tenant: Tenant) -> None:
    colleague = add_member(tenant.project)
    submit(api, job_body, name="mine")
    submit(client_for(colleague), job_body, name="theirs")
    admin = client_for(tenant.admin)
    assert names(admin, user=colleague.username) == ["theirs"] == names(admin, user=str(colleague.pk))
    assert names(api, user=tenant.user.username) == ["mine"]
    # Unknown, or known but with no job the caller sees: an empty list, as for an unknown id.
    stranger = make_tenant().user
    for who in ("nobody-at-all", stranger.username, "-1", str(10**9)):
        assert names(admin, user=who) == []


@pytest.mark.parametrize("value, message", [
    ("0", "Ensure this value is greater than or equal to 1."),
    (str(2**53 + 1), "Ensure this value is less than or equal to 9007199254740992."),
    ("x" * 151, "Ensure this field has no more than 150 characters."),
    ("", "This field may not be blank."),
    ("a\x00b", "Null characters are not allowed."),
])
def test_a_malformed_user_filter_is_a_400_naming_it(api: APIClient, value: str, message: str) -> None:
    response = api.get(f"/api/v1/jobs?{urlencode({'user': value})}")
    assert response.status_code == 400, response.content
    assert response.json()["errors"] == {"user": [message]}
