"""GET /jobs/{id}: each attempt says where it ran and what it was charged (QA: only the current hold
was visible, so a job's cost across retries could not be seen), in a constant number of queries."""

from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger.services import capture
from scheduling.models import Job
from scheduling.services.lifecycle import finish_attempt
from tests.api.test_job_dependencies import run, submit

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
