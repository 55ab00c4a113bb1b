"""GET /jobs/{id}: each attempt says where it ran and what it was charged (QA: only the current hold
was visible, so a job's cost across retries could not be seen), in a constant number of queries."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.clock import shifted
from ledger.models import MICRO, Hold
from ledger.services import capture, expire_due_buckets
from scheduling.api.serializers import render_hold_summary
from scheduling.models import Job
from scheduling.services.lifecycle import finish_attempt
from tests.api.factories import Tenant
from tests.api.test_job_dependencies import run, submit
from tests.factories import fund

pytestmark = pytest.mark.django_db


def test_attempts_show_their_nodes_and_charges_and_the_retry_limit(
    api: APIClient, job_body: Callable, django_assert_max_num_queries: Any
) -> None:
    job = submit(api, job_body, gpu_types=["H100"])
    assert job["max_retries"] == 3
    first = run(job["id"])
    capture(hold=first.hold, amount=1_234, key="detail-capture")
    finish_attempt(attempt=first, outcome="lost")  # requeued (after a backoff) on a fresh hold
    Job.objects.filter(pk=job["id"]).update(not_before=None)
    second = run(job["id"])
    with django_assert_max_num_queries(5):  # key, job, attempts, allocations, nodes: not per attempt
        body = api.get(f"/api/v1/jobs/{job['id']}").json()
    attempts = body["attempts"]
    assert [a["number"] for a in attempts] == [1, 2]
    assert attempts[0]["nodes"] in (["H100-eu"], ["H100-us"])  # the test fleet's H100 nodes
    assert attempts[0]["charged"] == 1_234 and attempts[0]["outcome"] == "lost"
    assert attempts[1]["charged"] == 0 and attempts[1]["nodes"] == sorted(
        {a.node.name for a in second.allocations.select_related("node")}
    )


def test_the_hold_summary_says_what_went_back_and_what_expired(
    api: APIClient, job_body: Callable, tenant: Tenant
) -> None:
    """QA: a held job drew 3,000,000 from a bucket that expired; cancelled after the expiry sweep,
    its hold said `released: 3000000` although the org got nothing back (it all went to expiry)."""
    fund(tenant.org, 3 * MICRO, expires_at=timezone.now() + timedelta(hours=1))  # drawn first
    job = submit(api, job_body, gpu_types=["H100"], held=True)
    authorized = job["hold"]["authorized"]
    assert authorized > 3 * MICRO  # the rest comes from the tenant's unexpiring credits
    assert (job["hold"]["released"], job["hold"]["expired"]) == (0, 0)
    with shifted(timedelta(hours=2)):
        expire_due_buckets()
        cancelled = api.post(f"/api/v1/jobs/{job['id']}/cancel", format="json",
                             HTTP_IDEMPOTENCY_KEY="cancel-after-expiry").json()
    assert cancelled["state"] == "cancelled"
    want = {"captured": 0, "released": authorized - 3 * MICRO, "expired": 3 * MICRO, "remaining": 0}
    assert {k: cancelled["hold"][k] for k in want} == want
    detail = api.get(f"/api/v1/jobs/{job['id']}").json()["hold"]
    listed = api.get("/api/v1/jobs").json()["results"][0]["hold"]
    assert detail == listed == cancelled["hold"]
    assert render_hold_summary(Hold.objects.get(pk=detail["id"])) == detail
