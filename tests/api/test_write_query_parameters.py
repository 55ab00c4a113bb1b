"""Write routes take no query parameters: one given is a 400 naming it, and nothing is written.

QA: `POST /orgs/{id}/credits?dry_run=1` really issued the credits, `POST /jobs?project=2` and
`PUT /orgs/{id}/budget?dry_run=1` the same: write routes ignored what the GET routes refuse.
"""

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import IdempotencyRecord, Membership, Organization, Project
from audit.models import AuditEvent
from budgets.models import Budget
from ledger.models import Bucket, Hold
from scheduling.models import Job, JobState
from tests.api.conftest import client_for
from tests.api.factories import Tenant
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

BUDGET = {"period": "month", "limit": 10**12, "enforcement": "soft"}


def _snapshot() -> tuple[Any, ...]:
    return (
        [(j.pk, j.state, j.held) for j in Job.objects.order_by("pk")],
        list(Bucket.objects.order_by("pk").values_list("pk", "available")),
        list(Hold.objects.order_by("pk").values_list("pk", "state", "released")),
        list(Budget.objects.order_by("pk").values_list("pk", "limit")),
        Organization.objects.count(), Project.objects.count(),
        list(Membership.objects.order_by("pk").values_list("pk", "role")),
        IdempotencyRecord.objects.count(), AuditEvent.objects.count(),
    )


@pytest.fixture
def queued_job(tenant: Tenant, job_body: Callable[..., dict[str, Any]]) -> int:
    response = client_for(tenant.user).post("/api/v1/jobs", job_body(gpu_count=1), format="json",
                                            HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
    assert response.status_code == 201, response.content
    return response.json()["id"]


def _routes(t: Tenant, job_id: int, job_body: Callable[..., dict[str, Any]]) -> list[tuple[str, str, Any]]:
    o, p, u = t.org.pk, t.project.pk, t.user.pk
    return [
        ("post", "/api/v1/orgs", {"name": "New", "slug": "new"}),
        ("post", f"/api/v1/orgs/{o}/projects", {"name": "x", "slug": "x"}),
        ("post", f"/api/v1/projects/{p}/members", {"username": UserFactory().username, "role": "member"}),
        ("post", f"/api/v1/orgs/{o}/credits",
         {"amount": 7, "kind": "paid", "source": "purchase", "reference": "inv-1", "reason": "r"}),
        ("put", f"/api/v1/orgs/{o}/budget", BUDGET),
        ("put", f"/api/v1/projects/{p}/budget", BUDGET),
        ("put", f"/api/v1/projects/{p}/members/{u}/budget", BUDGET),
        ("post", "/api/v1/jobs", job_body(gpu_count=1)),
        ("post", f"/api/v1/jobs/{job_id}/hold", None),
        ("post", f"/api/v1/jobs/{job_id}/cancel", None),
    ]


@pytest.mark.parametrize("query", ["dry_run=1", "project=2", "format=json", "dry_run=1&dry_run=0"])
def test_every_write_route_refuses_a_query_parameter_and_changes_nothing(
    tenant: Tenant, queued_job: int, job_body: Callable[..., dict[str, Any]], query: str
) -> None:
    finance = UserFactory()
    finance.groups.add(Group.objects.get_or_create(name="finance")[0])
    caller = client_for(finance)  # finance may call every one of them
    name = query.split("=")[0]
    before = _snapshot()
    for method, url, body in _routes(tenant, queued_job, job_body):
        with CaptureQueriesContext(connection) as queries:
            response = getattr(caller, method)(f"{url}?{query}", body, format="json",
                                               HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
        assert response.status_code == 400, (method, url, response.content)
        problem = response.json()
        assert response["Content-Type"] == "application/problem+json"
        assert problem["type"] == "validation-error"
        assert problem["errors"] == {name: ["Unknown query parameter."]}, (method, url)
        # Refused before the idempotency record is claimed: nothing of it was even tried.
        assert not [q for q in queries.captured_queries if "idempotencyrecord" in q["sql"]], (method, url)
    assert _snapshot() == before
    assert Job.objects.get(pk=queued_job).state == JobState.QUEUED


def test_the_same_request_without_the_parameter_goes_through(tenant: Tenant) -> None:
    admin = client_for(tenant.admin)
    url = f"/api/v1/orgs/{tenant.org.pk}/budget"
    refused = admin.put(f"{url}?dry_run=1", BUDGET, format="json", HTTP_IDEMPOTENCY_KEY="k")
    assert refused.status_code == 400 and not Budget.objects.exists()
    done = admin.put(url, BUDGET, format="json", HTTP_IDEMPOTENCY_KEY="k")  # the key was not spent
    assert done.status_code == 201 and "Idempotent-Replayed" not in done
