"""GET /api/v1/jobs filters, as Slurm's sacct offers them: several states, a user, a name prefix, a
wait reason and a submission window; anything malformed is a 400 that says which filter."""

from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from scheduling.models import Job, JobState
from tests.api.conftest import client_for
from tests.api.factories import Tenant, add_member
from tests.api.test_job_dependencies import submit

pytestmark = pytest.mark.django_db


def names(client: APIClient, **query: str) -> list[str]:
    response = client.get(f"/api/v1/jobs?{urlencode(query)}")
    assert response.status_code == 200, response.content
    return sorted(job["name"] for job in response.json()["results"])


def test_filters_combine(api: APIClient, job_body: Callable, tenant: Tenant) -> None:
    colleague = add_member(tenant.project)
    sweep = [submit(api, job_body, name=f"sweep-lr{i}") for i in range(3)]
    submit(client_for(colleague), job_body, name="eval")
    Job.objects.filter(pk=sweep[0]["id"]).update(state=JobState.RUNNING, wait_reason="")
    Job.objects.filter(pk=sweep[1]["id"]).update(wait_reason="quota",
                                                 submitted_at=timezone.now() - timedelta(days=2))
    admin = client_for(tenant.admin)  # an org admin sees every member's jobs

    assert names(admin, state="queued,running") == ["eval", "sweep-lr0", "sweep-lr1", "sweep-lr2"]
    assert names(admin, state="running") == ["sweep-lr0"]
    repeated = admin.get("/api/v1/jobs?state=queued&state=running").json()  # OpenAPI's array style
    assert sorted(job["name"] for job in repeated["results"]) == names(admin, state="queued,running")
    assert names(admin, user=str(colleague.pk)) == ["eval"]
    assert names(admin, name="sweep-", state="queued") == ["sweep-lr1", "sweep-lr2"]
    assert names(admin, wait_reason="quota") == ["sweep-lr1"]
    yesterday = (timezone.now() - timedelta(days=1)).isoformat()
    assert names(admin, submitted_until=yesterday) == ["sweep-lr1"]
    assert names(admin, submitted_since=yesterday, name="sweep") == ["sweep-lr0", "sweep-lr2"]
    assert names(api, user=str(colleague.pk)) == ["eval"]  # a project member sees the project's jobs
    assert names(admin, submitted_since=yesterday, submitted_until=yesterday) == []  # an empty window


@pytest.mark.parametrize("query, field", [
    ("state=queued,nope", "state"),
    ("submitted_since=2026-11-01T00:00:00", "submitted_since"),  # no offset: which midnight?
    ("user=0", "user"),
    ("name=", "name"),
    ("owner=3", "owner"),
    ("user=1&user=2", "user"),  # review: a repeated parameter kept only its last value, silently
    ("state=", "state"),  # QA: an empty state dropped the filter and listed every job
    # QA: an empty item in the list was dropped silently while an empty state is a 400.
    ("state=queued,,running", "state"), ("state=queued,", "state"), ("state=,queued", "state"),
    ("state=queued&state=", "state"),
    ("wait_reason=bogus", "wait_reason"),  # QA: an unknown reason listed nothing, silently
    # QA: a reversed window listed nothing, silently (the journal's answers 400 already).
    ("submitted_since=2026-11-02T00:00:00Z&submitted_until=2026-11-01T00:00:00Z", "submitted_until"),
])
def test_bad_filters_are_400(query: str, field: str, api: APIClient, tenant: Tenant) -> None:
    response = api.get(f"/api/v1/jobs?{query}")
    assert response.status_code == 400 and field in response.json()["errors"], response.content


def test_an_empty_state_in_the_list_says_so(api: APIClient) -> None:
    response = api.get("/api/v1/jobs?state=queued,,running")
    assert response.json()["errors"] == {"state": [
        "An empty state in the list: give states separated by single commas, e.g. queued,running."]}


def test_an_unknown_parameter_is_named_as_one(api: APIClient) -> None:
    """QA: `?statee=queued` said "Unknown field.", as a body would; docs/api.md says otherwise."""
    response = api.get("/api/v1/jobs?statee=queued")
    assert response.json()["errors"] == {"statee": ["Unknown query parameter."]}


@pytest.mark.parametrize("reason", [
    "reserved-for-job-0", "reserved-for-job-007", "reserved-for-job-00",
    "reserved-for-job-1234567890123456789", "reserved-for-job-", "reserved-for-job--1",
])
def test_a_reservation_reason_names_a_job_id(reason: str, api: APIClient) -> None:
    """Review: `reserved-for-job-0` (no job is 0) and `reserved-for-job-007` (job 7's reason is
    `reserved-for-job-7`) listed nothing, silently, while a 19-digit id was a 400."""
    response = api.get("/api/v1/jobs", {"wait_reason": reason})
    assert response.status_code == 400, response.content
    [message] = response.json()["errors"]["wait_reason"]
    assert message.endswith(", or reserved-for-job-N with N a job id (1 or more, up to 18 digits, "
                            "no leading zero)."), message


def test_a_reservation_reason_of_a_job_lists_it(api: APIClient, job_body: Callable) -> None:
    job = submit(api, job_body, name="waits")
    Job.objects.filter(pk=job["id"]).update(wait_reason="reserved-for-job-7")
    assert names(api, wait_reason="reserved-for-job-7") == ["waits"]
    assert names(api, wait_reason="reserved-for-job-10") == []
    assert names(api, wait_reason="reserved-for-job-123456789012345678") == []
