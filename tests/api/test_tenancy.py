"""Every route answers 404 for objects of another tenant (never 403, never data)."""

import uuid

import pytest
from rest_framework.test import APIClient

from budgets.services import set_budget
from scheduling.models import Job
from tests.api.conftest import client_for
from tests.api.factories import Tenant, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def victim(fleet: dict) -> Tenant:
    tenant = make_tenant(funds=10**9)
    set_budget(org=tenant.org, period="month", limit=10**12, enforcement="soft")
    set_budget(org=tenant.org, project=tenant.project, period="month", limit=10**12, enforcement="soft")
    set_budget(org=tenant.org, project=tenant.project, user=tenant.user, period="month", limit=10**12,
               enforcement="soft")
    return tenant


@pytest.fixture
def victim_job(victim: Tenant) -> Job:
    client = client_for(victim.user)
    response = client.post("/api/v1/jobs", {
        "project": victim.project.pk, "name": "secret", "gpu_types": ["H100"], "gpu_count": 1,
        "max_wall_seconds": 60, "priority_class": "batch"}, format="json", HTTP_IDEMPOTENCY_KEY="v")
    assert response.status_code == 201
    return Job.objects.get(pk=response.json()["id"])


def routes(t: Tenant, job: Job) -> list[tuple[str, str, dict | None]]:
    o, p, u = t.org.pk, t.project.pk, t.user.pk
    budget = {"period": "month", "limit": 1, "enforcement": "hard"}
    return [
        ("get", f"/api/v1/orgs/{o}", None),
        ("get", f"/api/v1/orgs/{o}/balance", None),
        ("get", f"/api/v1/orgs/{o}/transactions", None),
        ("post", f"/api/v1/orgs/{o}/projects", {"name": "x", "slug": "x"}),
        ("post", f"/api/v1/orgs/{o}/credits",
         {"amount": 1, "kind": "paid", "source": "purchase", "reference": "r", "reason": "r"}),
        ("get", f"/api/v1/orgs/{o}/budget", None),
        ("put", f"/api/v1/orgs/{o}/budget", budget),
        ("get", f"/api/v1/projects/{p}", None),
        ("get", f"/api/v1/projects/{p}/balance", None),
        ("post", f"/api/v1/projects/{p}/members", {"user": u}),
        ("get", f"/api/v1/projects/{p}/budget", None),
        ("put", f"/api/v1/projects/{p}/budget", budget),
        ("get", f"/api/v1/projects/{p}/members/{u}/budget", None),
        ("put", f"/api/v1/projects/{p}/members/{u}/budget", budget),
        ("get", f"/api/v1/jobs/{job.pk}", None),
        ("post", f"/api/v1/jobs/{job.pk}/cancel", None),
        ("post", "/api/v1/jobs", {"project": p, "name": "x", "gpu_types": ["H100"], "gpu_count": 1,
                                  "max_wall_seconds": 60, "priority_class": "batch"}),
    ]


@pytest.mark.parametrize("who", ["member", "admin"])
def test_other_tenant_gets_404_everywhere(victim: Tenant, victim_job: Job, who: str) -> None:
    intruder_tenant = make_tenant(funds=10**9)
    intruder = client_for(intruder_tenant.user if who == "member" else intruder_tenant.admin)
    for method, url, body in routes(victim, victim_job):
        response = getattr(intruder, method)(url, body, format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
        assert response.status_code == 404, (method, url, response.status_code, response.content)
        assert response.json()["type"] == "not-found"
        assert "secret" not in response.content.decode()
    assert Job.objects.count() == 1


def test_lists_only_show_own_tenant(victim: Tenant, victim_job: Job) -> None:
    other = make_tenant(funds=10**9)
    client: APIClient = client_for(other.user)
    assert client.get("/api/v1/jobs").json()["results"] == []
    assert client.get(f"/api/v1/jobs?project={victim.project.pk}").json()["count"] == 0
    assert [o["id"] for o in client.get("/api/v1/orgs").json()["results"]] == [other.org.pk]


def test_project_member_sees_project_but_not_org_money(victim: Tenant, victim_job: Job) -> None:
    member = client_for(victim.user)
    assert member.get(f"/api/v1/projects/{victim.project.pk}/balance").status_code == 200
    assert member.get(f"/api/v1/jobs/{victim_job.pk}").status_code == 200
    response = member.get(f"/api/v1/orgs/{victim.org.pk}/balance")
    assert response.status_code == 403 and response.json()["type"] == "permission-denied"


@pytest.mark.parametrize(
    "path", ["/api/v1/nope", "/api/v1/jobs/%0A", "/api/v1/projects/x%0Ay/members/1/budget"]
)
def test_unknown_api_paths_are_problem_404s_even_with_newlines(victim: Tenant, path: str) -> None:
    response = client_for(victim.user).get(path)
    assert response.status_code == 404 and response["Content-Type"] == "application/problem+json"
    assert response.json()["type"] == "not-found"
    assert response.content.startswith(b'{"type":"not-found","title":"Not found",')  # compact, as the rest
