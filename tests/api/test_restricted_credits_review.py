"""Review of 0980b4e: once a job is placed, its hold pays only for the type it was placed on (the run's
rate is fixed; a requeue gets a fresh hold). docs/ledger.md: a restricted bucket is eligible "if
every GPU type the hold may run on is in its list". A job accepting ["A100", "H100"], held on
unrestricted credits (enough for its first window) and placed on A100, is stopped `out_of_credit`
at its first extension while the org's A100-restricted credits sit unused: extensions (and
placement top-ups) draw only on buckets for every type the job accepted, never narrowed to the
placed type."""

from __future__ import annotations

import pytest

from ledger.models import MICRO, Bucket
from ledger.services import void_credits
from metering.charging import Action
from metering.heartbeats import HeartbeatItem
from metering.services import charge_progress, ingest_heartbeats, report_started
from scheduling.models import Allocation, JobAttempt
from scheduling.services.submission import JobSpec, submit_job
from scheduling.services.tick import run_scheduling_pass
from tests.api.factories import make_tenant
from tests.factories import fund
from tests.metering.conftest import shift_started

pytestmark = pytest.mark.django_db

WINDOW_S = 600


def test_a_run_placed_on_a100_is_extended_from_a100_restricted_credits(fleet: dict) -> None:
    tenant = make_tenant(hold_window_seconds=WINDOW_S)
    unrestricted = fund(tenant.org, 5 * MICRO)  # plenty for the first window (H100: 0.67)
    fund(tenant.org, 100 * MICRO, gpu_types=("A100",))
    job = submit_job(
        user=tenant.user, project=tenant.project, idempotency_key="k",
        spec=JobSpec(name="j", gpu_types=("A100", "H100"), gpu_count=1, max_wall_seconds=36_000,
                     priority_class="standard", regions=("eu",)),
    )
    assert sorted(job.current_hold.gpu_types) == ["A100", "H100"]  # not narrowed: unrestricted paid
    run_scheduling_pass(trigger="test")
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.gpu_type.name == "A100"
    node = Allocation.objects.filter(attempt=attempt).first().node
    report_started(node=node, attempt_id=attempt.pk)
    shift_started(attempt, 36_000)
    # The unrestricted credits are spent elsewhere (another job, a void: the same to this one).
    unrestricted.refresh_from_db()
    void_credits(bucket=unrestricted, reason="spent elsewhere", key="v", amount=unrestricted.available)
    used = (WINDOW_S - 60) * 1000  # 9 of its 10 held minutes used
    ingest_heartbeats(node=node, items=[HeartbeatItem(attempt.pk, 1, used)])
    result = charge_progress(attempt=attempt)
    restricted = Bucket.objects.get(org=tenant.org, gpu_types=["A100"])
    assert Action.STOPPED not in result.actions, (
        f"an A100 run stopped out_of_credit with {restricted.available} A100-restricted credits "
        f"available: {JobAttempt.objects.get(pk=attempt.pk).stop_detail}"
    )
    assert Action.EXTENDED in result.actions


@pytest.mark.parametrize("in_sql", [True, False])
def test_a_402_does_not_suggest_types_that_could_never_run_the_job(
    fleet: dict, job_body: object, settings: object, in_sql: bool,
) -> None:
    """A100 has no node in the job's region: the A100 cut is skipped (never runnable) and the job
    refused 402, whose detail then tells the user to submit with gpu_types ["A100"], which is
    refused 400 "can never run"."""
    from scheduling.models import Node
    from tests.api.conftest import client_for
    from tests.api.test_jobs_submit import post

    settings.JOBS_SUBMIT_IN_SQL = in_sql  # type: ignore[attr-defined]
    Node.objects.filter(name="A100-us").delete()
    tenant = make_tenant()
    fund(tenant.org, 10 * MICRO, gpu_types=("A100",))
    api = client_for(tenant.user)
    body = {"project": tenant.project.pk, "name": "t", "gpu_types": ["H100", "A100"], "gpu_count": 1,
            "max_wall_seconds": 3600, "priority_class": "standard", "regions": ["us"]}
    refused = post(api, body)
    assert refused.status_code == 402, refused.json()
    detail = refused.json()["detail"]
    suggested = post(api, {**body, "gpu_types": ["A100"]})
    assert 'gpu_types ["A100"]' not in detail or suggested.status_code == 201, (
        f"402 says: {detail!r}; following it: {suggested.status_code} {suggested.json().get('detail')}"
    )


def test_a_requeue_chooses_the_hold_types_as_the_submission_did(fleet: dict) -> None:
    """docs/api.md: "a requeue chooses the same way". With 3 unrestricted credits (short of an
    H100 hour, enough for an A100 one) and A100-restricted ones, the submission holds ["A100"];
    the requeue holds all of the job's types at A100's price (its price tiers come first), so
    the next pass may try H100 and a top-up of the unrestricted credits."""
    from scheduling.models import Job
    from scheduling.services.lifecycle import finish_attempt

    tenant = make_tenant()
    fund(tenant.org, 3 * MICRO)
    fund(tenant.org, 10 * MICRO, gpu_types=("A100",))
    job = submit_job(
        user=tenant.user, project=tenant.project, idempotency_key="k",
        spec=JobSpec(name="j", gpu_types=("H100", "A100"), gpu_count=1, max_wall_seconds=3600,
                     priority_class="standard"),
    )
    assert job.current_hold.gpu_types == ["A100"]
    run_scheduling_pass(trigger="test")
    finish_attempt(attempt=JobAttempt.objects.get(job=job), outcome="withdrawn")
    job = Job.objects.select_related("current_hold").get(pk=job.pk)
    assert job.current_hold.gpu_types == ["A100"], job.current_hold.gpu_types


def test_the_hold_summarys_gpu_types_is_typed_in_the_schema() -> None:
    """docs/api.md: `gpu_types` is a list of type names; the OpenAPI schema leaves it untyped (any
    JSON), unlike the job's own `gpu_types`, and does not list it as required though always sent."""
    from drf_spectacular.generators import SchemaGenerator

    schemas = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    field = schemas["HoldSummary"]["properties"]["gpu_types"]
    assert field.get("type") == "array" and field.get("items", {}).get("type") == "string", field
