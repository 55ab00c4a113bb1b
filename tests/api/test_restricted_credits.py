"""QA: an org whose only credits are restricted to A100 submits a job accepting H100 and A100: it
was refused 402 "only 0.00 available" beside a balance showing them. Now the job is held on the
types its credits pay for, runs only on those, and a refusal names the restriction."""

from collections.abc import Callable
from typing import Any

import pytest

from ledger.models import MICRO, Bucket, Hold
from scheduling.models import Job, JobAttempt
from tests.api.conftest import A100_PRICE, client_for
from tests.api.factories import make_tenant
from tests.api.test_jobs_submit import post
from tests.factories import fund

pytestmark = pytest.mark.django_db

BOTH_ORDERS = pytest.mark.parametrize("types", [["H100", "A100"], ["A100", "H100"]])
BOTH_PATHS = pytest.mark.parametrize("in_sql", [True, False])  # the one-statement path and the Python one


def restricted_tenant(amount: int, *gpu_types: str) -> Any:
    tenant = make_tenant()
    fund(tenant.org, amount, gpu_types=gpu_types or ("A100",))
    return tenant


def body_for(tenant: Any, job_body: Callable, types: list[str]) -> dict[str, Any]:
    return job_body(project=tenant.project.pk, gpu_types=types, gpu_count=1, max_wall_seconds=3600)


@BOTH_ORDERS
@BOTH_PATHS
def test_a_job_is_held_on_the_types_its_restricted_credits_pay_for(
    job_body: Callable, settings: Any, types: list[str], in_sql: bool,
) -> None:
    settings.JOBS_SUBMIT_IN_SQL = in_sql
    tenant = restricted_tenant(10 * MICRO)
    api = client_for(tenant.user)
    response = post(api, body_for(tenant, job_body, types))
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["gpu_types"] == types  # the request as made
    assert body["hold"]["gpu_types"] == ["A100"] and body["hold"]["authorized"] == A100_PRICE
    assert body["estimate"] == A100_PRICE  # priced at A100, not H100: never more than needed
    hold = Hold.objects.get(pk=body["hold"]["id"])
    assert hold.gpu_types == ["A100"] and hold.authorized == A100_PRICE
    (bucket,) = Bucket.objects.filter(org=tenant.org)
    assert bucket.held == A100_PRICE
    detail = api.get(f"/api/v1/jobs/{body['id']}").json()
    assert detail["hold"]["gpu_types"] == ["A100"]


@BOTH_PATHS
def test_the_job_runs_only_on_the_types_its_hold_pays_for(job_body: Callable, settings: Any,
                                                          in_sql: bool) -> None:
    """H100 first in its preference, free, and cheap enough to top up from the A100 credits: it
    must still run on A100 (a restricted bucket never pays for a type it is not for)."""
    from scheduling.services.tick import run_scheduling_pass

    settings.JOBS_SUBMIT_IN_SQL = in_sql
    tenant = restricted_tenant(100 * MICRO)
    response = post(client_for(tenant.user), body_for(tenant, job_body, ["H100", "A100"]))
    assert response.status_code == 201, response.json()
    run_scheduling_pass(trigger="test")
    attempt = JobAttempt.objects.get(job_id=response.json()["id"])
    assert attempt.gpu_type.name == "A100" and attempt.rate_per_gpu_hour == A100_PRICE
    hold = Hold.objects.get(pk=response.json()["hold"]["id"])
    assert hold.authorized == A100_PRICE  # never topped up for H100


def test_a_requeued_job_is_held_again_on_the_types_its_credits_pay_for(job_body: Callable) -> None:
    from scheduling.services.lifecycle import finish_attempt
    from scheduling.services.tick import run_scheduling_pass

    tenant = restricted_tenant(10 * MICRO)
    response = post(client_for(tenant.user), body_for(tenant, job_body, ["H100", "A100"]))
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    run_scheduling_pass(trigger="test")
    finish_attempt(attempt=JobAttempt.objects.get(job=job), outcome="withdrawn")  # requeued, fresh hold
    job.refresh_from_db()
    assert job.state == "queued" and job.current_hold_id is not None, job.wait_detail
    assert job.current_hold.gpu_types == ["A100"] and job.current_hold.authorized == A100_PRICE


@pytest.mark.parametrize("types", [["H100", "A100"], ["H100"]])
@BOTH_PATHS
def test_a_refusal_names_the_gpu_type_restriction(job_body: Callable, settings: Any, types: list[str],
                                                  in_sql: bool) -> None:
    settings.JOBS_SUBMIT_IN_SQL = in_sql
    tenant = restricted_tenant(MICRO)  # 1 credit: short of an A100 GPU-hour too
    response = post(client_for(tenant.user), body_for(tenant, job_body, types))
    assert response.status_code == 402, response.json()
    problem = response.json()
    assert problem["type"] == "insufficient-credits" and problem["available"] == 0
    assert "restricted to certain GPU types (1.00 to A100)" in problem["detail"], problem["detail"]
    if "A100" in types:  # tried already: too few (QA: it was told to submit with ["A100"] again)
        assert "those for A100 are too few for it" in problem["detail"], problem["detail"]
    else:
        assert 'gpu_types ["A100"]' in problem["detail"]
    assert problem["restricted"] == [{"gpu_types": ["A100"], "available": MICRO}]
    assert Job.objects.filter(org=tenant.org).count() == 0
