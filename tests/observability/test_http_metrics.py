"""/metrics after real API requests: HTTP histograms by route name and status, submission counters."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger.models import MICRO
from tests.api.conftest import H100_PRICE, client_for
from tests.api.factories import Tenant, make_tenant
from tests.observability.scrape import delta, scrape, value

pytestmark = pytest.mark.django_db

HTTP = "gpubank_http_request_duration_seconds"


def post_job(client: APIClient, body: dict[str, Any]) -> Any:
    return client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)


def test_http_histogram_and_counter_by_route_and_status(api: APIClient) -> None:
    before = scrape()
    assert api.get("/api/v1/jobs").status_code == 200
    assert api.get("/api/v1/jobs/999999").status_code == 404
    after = scrape()
    ok = {"route": "jobs", "method": "GET", "status": "200"}
    assert delta(before, after, f"{HTTP}_count", **ok) == 1
    assert delta(before, after, f"{HTTP}_bucket", **ok, le="+Inf") == 1
    assert delta(before, after, f"{HTTP}_sum", **ok) > 0
    assert delta(before, after, "gpubank_http_requests_total", **ok) == 1
    # The route *name*, not the path: one series for every job id.
    assert delta(before, after, "gpubank_http_requests_total",
                 route="job-detail", method="GET", status="404") == 1
    # The scrape itself is a request too.
    assert value(after, "gpubank_http_requests_total", route="metrics", method="GET", status="200") >= 1


def test_accepted_submission_counts_hold_and_ledger_movement(
    api: APIClient, job_body: Callable[..., dict[str, Any]],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    before = scrape()
    with django_capture_on_commit_callbacks(execute=True):
        response = post_job(api, job_body(gpu_count=1))
    assert response.status_code == 201, response.json()
    after = scrape()
    assert delta(before, after, "gpubank_job_submissions_total", result="accepted") == 1
    assert delta(before, after, "gpubank_hold_events_total", event="placed") == 1
    # Ledger counters move only on commit, by the amount held (1 GPU-hour of H100).
    assert delta(before, after, "gpubank_ledger_microcredits_total", kind="hold") == H100_PRICE
    assert delta(before, after, f"{HTTP}_count", route="jobs", method="POST", status="201") == 1


def test_rolled_back_ledger_work_counts_nothing(api: APIClient, job_body: Callable) -> None:
    # Without a commit (the test's transaction never commits) the ledger counters stay put.
    before = scrape()
    assert post_job(api, job_body(gpu_count=1)).status_code == 201
    after = scrape()
    assert delta(before, after, "gpubank_hold_events_total", event="placed") == 0
    assert delta(before, after, "gpubank_job_submissions_total", result="accepted") == 1


def test_rejections_by_reason(fleet: Any, settings: Any) -> None:
    poor = make_tenant(funds=MICRO // 10)
    body = {"project": poor.project.pk, "name": "t", "gpu_types": ["H100"], "gpu_count": 1,
            "gpu_memory_gb": 40, "max_wall_seconds": 3600, "priority_class": "standard"}
    client = client_for(poor.user)
    before = scrape()
    response = post_job(client, body)
    assert response.status_code == 402 and response.json()["type"] == "insufficient-credits"
    assert post_job(client, {**body, "gpu_types": ["B200"]}).status_code == 400
    settings.API_RATE_LIMITS = {"default": {"key": "100000/minute", "org": "100000/minute"},
                                "jobs-submit": {"key": "1/minute"}}
    limited = [post_job(client, body).status_code for _ in range(2)]
    assert 429 in limited
    after = scrape()
    reasons = {r: delta(before, after, "gpubank_job_submissions_rejected_total", reason=r)
               for r in ("insufficient-credits", "validation-error", "rate-limited")}
    assert reasons["insufficient-credits"] >= 1 and reasons["validation-error"] == 1
    assert reasons["rate-limited"] == 1
    assert delta(before, after, "gpubank_job_submissions_total", result="rejected") == sum(
        delta(before, after, "gpubank_job_submissions_rejected_total", reason=r)
        for r in reasons
    )


def test_budget_exceeded_is_its_own_reason(api: APIClient, job_body: Callable, tenant: Tenant) -> None:
    put = client_for(tenant.admin).put(
        f"/api/v1/projects/{tenant.project.pk}/budget",
        {"period": "month", "limit": H100_PRICE // 2, "enforcement": "hard"},
        format="json", HTTP_IDEMPOTENCY_KEY="b1",
    )
    assert put.status_code == 201, put.json()
    before = scrape()
    response = post_job(api, job_body(gpu_count=1))
    assert response.status_code == 402 and response.json()["type"] == "budget-exceeded"
    after = scrape()
    assert delta(before, after, "gpubank_job_submissions_rejected_total", reason="budget-exceeded") == 1


def test_submission_paths(api: APIClient, job_body: Callable[..., dict[str, Any]], tenant: Tenant,
                          settings: Any) -> None:
    paths = ("one_statement", "declined", "python")
    before = scrape()
    assert post_job(api, job_body(gpu_count=1)).status_code == 201  # jobs_submit accepts it
    assert post_job(api, job_body(gpu_count=1000)).status_code == 402  # funds short: declined
    settings.JOBS_SUBMIT_IN_SQL = False
    assert post_job(api, job_body(gpu_count=1)).status_code == 201
    after = scrape()
    counts = [delta(before, after, "gpubank_job_submission_paths_total", path=p) for p in paths]
    assert counts == [1, 1, 1]


def test_metrics_need_the_scrape_token_when_one_is_set(client: Any, settings: Any) -> None:
    """Review: `/metrics` (queue depths, capacity, money flows) answered anyone; with
    METRICS_TOKEN set only a scrape with it does."""
    settings.METRICS_TOKEN = "s3cret-scrape"
    refused = client.get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"gpubank_" not in refused.content
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic s3cret-scrape").status_code == 401
    ok = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape")
    assert ok.status_code == 200 and b"gpubank_http_requests_total" in ok.content
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 200
