"""A 404 says what was not found (QA: Django's Http404 raised by API code was answered a bare
"Not found.", its message dropped): problem details with the message, as "No such API key."."""

import uuid
from typing import Any

import pytest
from rest_framework.test import APIClient

from tests.api.conftest import client_for
from tests.api.factories import Tenant

pytestmark = pytest.mark.django_db


def _not_found(response: Any, detail: str) -> None:
    assert response.status_code == 404, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert (body["type"], body["status"], body["detail"]) == ("not-found", 404, detail)


def test_a_level_without_a_budget_says_so(tenant: Tenant) -> None:
    admin = client_for(tenant.admin)
    for url in (f"/api/v1/orgs/{tenant.org.pk}/budget", f"/api/v1/projects/{tenant.project.pk}/budget",
                f"/api/v1/projects/{tenant.project.pk}/members/{tenant.user.pk}/budget"):
        _not_found(admin.get(url), "No budget at this level.")


def test_an_org_project_or_job_out_of_reach_is_named(api: APIClient, tenant: Tenant, job_body: Any) -> None:
    _not_found(api.get("/api/v1/orgs/999999999"), "No such organization.")
    _not_found(api.get("/api/v1/projects/999999999"), "No such project.")
    _not_found(api.get("/api/v1/jobs/999999999"), "No such job.")
    _not_found(api.post("/api/v1/jobs/999999999/cancel", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex),
               "No such job.")
    unknown_project = job_body(project=999999999)
    _not_found(api.post("/api/v1/jobs", unknown_project, format="json", HTTP_IDEMPOTENCY_KEY="k"),
               "No such project.")
