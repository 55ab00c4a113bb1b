"""POST /api/v1/jobs: the contract, pricing of the hold, and every rejection writes nothing."""

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework.test import APIClient

from accounts.models import OrgRole
from audit.models import AuditEvent
from budgets.models import BudgetPeriod
from ledger.models import MICRO, Hold, HoldState, LedgerTransaction
from scheduling.models import Job, Node
from tests.api.conftest import A100_PRICE, H100_PRICE, client_for
from tests.api.factories import Tenant, add_member
from tests.factories import OrgMembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


def post(api: APIClient, body: Any, key: str | None = "auto", **extra: Any) -> Any:
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex if key == "auto" else key}
    return api.post("/api/v1/jobs", body, format="json", **headers, **extra)


def nothing_written() -> None:
    assert Job.objects.count() == 0
    assert Hold.objects.count() == 0


def test_submit_returns_job_hold_and_estimate(api: APIClient, job_body: Callable, tenant: Tenant) -> None:
    response = post(api, job_body())
    assert response.status_code == 201, response.json()
    body = response.json()
    # 2 GPUs x 1 h x the highest price among acceptable types (H100).
    expected = 2 * H100_PRICE
    assert body["state"] == "queued"
    assert body["estimate"] == expected
    assert body["hold"]["authorized"] == expected and body["hold"]["state"] == "active"
    assert body["attempts"] == [] and body["priority_class"] == "standard"
    job = Job.objects.get(pk=body["id"])
    assert job.current_hold_id == body["hold"]["id"] and job.user == tenant.user
    # One event records the submission and its hold placement (the money movement stays audited).
    (event,) = AuditEvent.objects.filter(org_id=job.org_id).exclude(action="ledger.issue")
    assert (event.action, event.subject_id, event.amount) == ("sched.job.submit", str(job.pk), expected)
    txn = LedgerTransaction.objects.get(org_id=job.org_id, kind="hold")
    assert event.data["transaction"] == txn.pk and event.data["key"] == f"hold:job:{job.pk}:submit"
    assert event.data["hold"] == body["hold"]["id"] and sum(event.data["buckets"].values()) == expected


@pytest.mark.parametrize("held", [False, True])  # the one-statement path and the Python one
def test_hold_is_priced_only_over_types_that_can_run_the_job(api: APIClient, job_body: Callable,
                                                             held: bool) -> None:
    """QA: a job accepting H100 and A100 in a region with no H100 node held H100's price until it
    was placed on A100 (a spurious 402 at submission, credits held for nothing)."""
    from scheduling.pricing import catalog

    Node.objects.filter(name="H100-us").delete()
    catalog(fresh=True)  # the cached catalog still lists the node
    response = post(api, job_body(gpu_types=["H100", "A100"], regions=["us"], gpu_count=1, held=held))
    assert response.status_code == 201, response.json()
    assert response.json()["estimate"] == A100_PRICE  # 1 GPU-hour at A100's price
    assert Hold.objects.get(pk=response.json()["hold"]["id"]).authorized == A100_PRICE
    # Without the region, H100 can run it: the dearest is H100.
    assert post(api, job_body(gpu_types=["H100", "A100"], gpu_count=1)).json()["estimate"] == H100_PRICE


def test_a_type_runnable_after_submission_does_not_starve_a_job_its_hold_cannot_pay_for(
    job_body: Callable, fleet: dict,
) -> None:
    """Why holds priced over runnable types were reverted once (review): an H100 node appears in
    the job's region after it was held at A100's price; the core prefers H100, the top-up is
    refused (no credits beyond the hold), and the job waited `budget` pass after pass while A100
    sat free. Now the refusal caps it at its hold's price for a while: the next pass runs it on A100."""
    from scheduling.models import JobAttempt, NodeState, Region
    from scheduling.pricing import catalog
    from scheduling.services.tick import run_scheduling_pass
    from tests.api.factories import make_tenant

    tenant = make_tenant(funds=A100_PRICE)  # exactly one A100 GPU-hour
    api = client_for(tenant.user)
    Node.objects.filter(name="H100-us").delete()
    catalog(fresh=True)
    body = job_body(project=tenant.project.pk, gpu_types=["H100", "A100"], regions=["us"], gpu_count=1)
    response = post(api, body)
    assert response.status_code == 201, response.json()
    assert response.json()["estimate"] == A100_PRICE
    Node.objects.create(name="H100-us2", region=Region.objects.get(code="us"), gpu_type=fleet["H100"],
                        gpu_count=8, state=NodeState.READY)
    job = Job.objects.get(pk=response.json()["id"])
    run_scheduling_pass(trigger="test")  # H100 first: the top-up is refused
    job.refresh_from_db()
    assert (job.state, job.wait_reason) == ("queued", "budget")
    run_scheduling_pass(trigger="test")
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.rate_per_gpu_hour == A100_PRICE


def test_a_requeued_job_is_held_at_the_price_its_funds_cover(job_body: Callable, fleet: dict) -> None:
    """Review: accepted at A100's price (no H100 in its region), run on A100, then requeued after
    an H100 node appeared: its new hold was priced at H100's price, refused, and the job waited
    `budget` for ever with A100 free. Now the requeue holds at the next price level it can fund."""
    from scheduling.models import JobAttempt, NodeState, Region
    from scheduling.pricing import catalog
    from scheduling.services.lifecycle import finish_attempt
    from scheduling.services.tick import run_scheduling_pass
    from tests.api.factories import make_tenant

    tenant = make_tenant(funds=A100_PRICE)
    Node.objects.filter(name="H100-us").delete()
    catalog(fresh=True)
    body = job_body(project=tenant.project.pk, gpu_types=["H100", "A100"], regions=["us"], gpu_count=1)
    response = post(client_for(tenant.user), body)
    assert response.status_code == 201, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    run_scheduling_pass(trigger="test")
    attempt = JobAttempt.objects.get(job=job)
    Node.objects.create(name="H100-us2", region=Region.objects.get(code="us"), gpu_type=fleet["H100"],
                        gpu_count=8, state=NodeState.READY)
    catalog(fresh=True)
    finish_attempt(attempt=attempt, outcome="withdrawn")  # requeued at once, with a fresh hold
    job.refresh_from_db()
    assert job.state == "queued" and job.current_hold_id is not None, job.wait_detail
    assert job.current_hold.authorized == A100_PRICE and job.estimate == A100_PRICE
    run_scheduling_pass(trigger="test")  # H100 first: the top-up is refused, so it is capped
    run_scheduling_pass(trigger="test")
    second = JobAttempt.objects.filter(job=job).exclude(pk=attempt.pk).get()
    assert second.rate_per_gpu_hour == A100_PRICE


def test_hold_skips_types_below_memory_floor(api: APIClient, job_body: Callable) -> None:
    # A100 (40 GB) meets 40 GB; with a 64 GB floor only H100 counts; L4 never does.
    response = post(api, job_body(gpu_types=["A100", "L4"], gpu_memory_gb=24, gpu_count=1))
    assert response.json()["estimate"] == A100_PRICE
    response = post(api, job_body(gpu_types=["L4"], gpu_memory_gb=64))
    assert response.status_code == 400
    assert response.json()["type"] == "validation-error"
    assert "gpu_memory_gb" in response.json()["errors"]


@pytest.mark.parametrize("in_sql", [True, False])
def test_hold_covers_only_the_org_hold_window(api: APIClient, job_body: Callable, tenant: Tenant,
                                              settings: Any, in_sql: bool) -> None:
    """The estimate still prices the whole max wall time (QA: it showed the first window's hold),
    on both submission paths."""
    settings.JOBS_SUBMIT_IN_SQL = in_sql
    tenant.org.hold_window_seconds = 900
    tenant.org.save()
    body = post(api, job_body(max_wall_seconds=10 * 3600, gpu_count=1)).json()
    assert body["hold"]["authorized"] == H100_PRICE // 4  # 15 min, extended as the job runs
    assert body["estimate"] == 10 * H100_PRICE
    assert Job.objects.get(pk=body["id"]).estimate == 10 * H100_PRICE


def test_cost_rounds_up(api: APIClient, job_body: Callable) -> None:
    response = post(api, job_body(gpu_types=["A100"], gpu_count=1, max_wall_seconds=1))
    # ceil(1000 ms * 2.5e6 / 3.6e6) = ceil(694.4) = 695
    assert response.json()["estimate"] == 695


def test_insufficient_credits_is_402_with_needed_and_available(
    api: APIClient, job_body: Callable
) -> None:
    response = post(api, job_body(gpu_count=1000, max_wall_seconds=3600))
    assert response.status_code == 402
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "insufficient-credits"
    assert body["needed"] == 1000 * H100_PRICE and body["available"] == 1000 * MICRO
    nothing_written()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"gpu_count": 0}, "gpu_count"),
        ({"gpu_count": 10**9}, "gpu_count"),
        ({"gpu_count": "2"}, "gpu_count"),
        ({"gpu_count": 2.5}, "gpu_count"),
        ({"max_wall_seconds": -5}, "max_wall_seconds"),
        ({"gpu_memory_gb": -1}, "gpu_memory_gb"),
        ({"name": "x" * (1 << 20)}, None),
        ({"name": ""}, "name"),
        ({"name": 12}, "name"),
        ({"gpu_types": []}, "gpu_types"),
        ({"gpu_types": "H100"}, "gpu_types"),
        ({"gpu_types": ["TPU"]}, "gpu_types"),
        ({"gpu_types": ["H100", "A100", "H100"]}, "gpu_types"),  # distinct names only
        ({"gpu_types": ["H100"] * 9}, "gpu_types"),  # at most 8 (MAX_GPU_TYPES)
        ({"priority_class": "vip"}, "priority_class"),
        ({"preemptible": "no"}, "preemptible"),
        ({"regions": ["mars"]}, "regions"),
        ({"regions": ["eu", "us", "eu"]}, "regions"),  # QA: accepted and stored twice (201)
        ({"colour": "blue"}, "colour"),
    ],
)
def test_invalid_bodies_are_400_and_write_nothing(
    api: APIClient, job_body: Callable, overrides: dict, field: str | None
) -> None:
    response = post(api, job_body(**overrides))
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["type"] == "validation-error"
    if field:
        assert field in body["errors"]
    nothing_written()


@pytest.mark.parametrize("in_sql", [True, False])
def test_repeated_regions_are_refused_like_repeated_gpu_types(
    api: APIClient, job_body: Callable, settings: Any, in_sql: bool
) -> None:
    """QA: `"regions": ["eu-west", "eu-west"]` was a 201 and stored so, where repeated GPU types
    are a 400; both submission paths (one statement, Python) now refuse it the same way."""
    settings.JOBS_SUBMIT_IN_SQL = in_sql
    response = post(api, job_body(regions=["us", "us"]))
    assert response.status_code == 400, response.json()
    assert response.json()["errors"] == {"regions": ["Regions must not repeat."]}
    both = post(api, job_body(regions=["eu", "eu"], gpu_types=["H100", "H100"]))
    assert both.json()["errors"] == {"gpu_types": ["GPU types must not repeat."],
                                     "regions": ["Regions must not repeat."]}
    nothing_written()


def test_opting_out_of_preemption_is_a_privilege_of_non_preemptible_classes(
    api: APIClient, job_body: Callable
) -> None:
    response = post(api, job_body(priority_class="standard", preemptible=False))
    assert response.status_code == 403
    assert response.json()["type"] == "permission-denied" and response.json()["field"] == "preemptible"
    nothing_written()


def test_non_preemptible_allowed_for_production(api: APIClient, job_body: Callable) -> None:
    response = post(api, job_body(priority_class="production", preemptible=False))
    assert response.status_code == 201 and response.json()["preemptible"] is False
    default = post(api, job_body(priority_class="production"))
    assert default.json()["preemptible"] is False


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"null", b'{"gpu_count": NaN}',
                                 b"[" * 1100 + b"]" * 1100,  # QA: nested past both parsers' limits: 500
                                 b'{"a":' * 2000 + b"1" + b"}" * 2000])
def test_malformed_json_is_400(api: APIClient, raw: bytes) -> None:
    response = api.post("/api/v1/jobs", raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 400
    assert response.json()["type"] == "validation-error"
    nothing_written()


def test_wrong_content_type_is_415(api: APIClient) -> None:
    response = api.post("/api/v1/jobs", "a=b", content_type="application/x-www-form-urlencoded",
                        HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 415
    assert response.json()["type"] == "unsupported-media-type"


def test_missing_idempotency_key_is_400(api: APIClient, job_body: Callable) -> None:
    response = post(api, job_body(), key=None)
    assert response.status_code == 400
    assert response.json()["type"] == "idempotency-key-missing"
    nothing_written()


def test_replay_returns_stored_response(api: APIClient, job_body: Callable) -> None:
    first = post(api, job_body(), key="same")
    again = post(api, job_body(), key="same")
    assert first.status_code == again.status_code == 201
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert again.json() == first.json()
    assert Job.objects.count() == 1 and Hold.objects.count() == 1


def test_same_key_different_body_is_422(api: APIClient, job_body: Callable) -> None:
    post(api, job_body(), key="same")
    response = post(api, job_body(name="other"), key="same")
    assert response.status_code == 422
    assert response.json()["type"] == "idempotency-key-reused"
    assert Job.objects.count() == 1


def test_keys_are_per_caller(api: APIClient, job_body: Callable, tenant: Tenant) -> None:
    other = client_for(add_member(tenant.project))
    assert post(api, job_body(), key="shared").status_code == 201
    assert post(other, job_body(), key="shared").status_code == 201
    assert Job.objects.count() == 2


def test_failed_request_does_not_consume_its_key(api: APIClient, job_body: Callable) -> None:
    assert post(api, job_body(gpu_count=1000), key="k1").status_code == 402
    assert post(api, job_body(gpu_count=1), key="k1").status_code == 201


def test_viewer_may_not_submit(tenant: Tenant, job_body: Callable) -> None:
    viewer = client_for(add_member(tenant.project, role="viewer"))
    response = post(viewer, job_body())
    assert response.status_code == 403
    assert response.json()["type"] == "permission-denied"
    # She is a project member, so "only project members may submit" would not say what is wrong.
    assert response.json()["detail"] == (
        "Project viewers cannot submit jobs; project members with any other role, and org owners/admins, can."
    )
    nothing_written()


def test_cancel_refusal_tells_a_viewer_from_a_non_member(
    api: APIClient, tenant: Tenant, job_body: Callable
) -> None:
    job = post(api, job_body()).json()
    viewer = client_for(add_member(tenant.project, role="viewer"))
    org_member = UserFactory()  # sees every project of the org, but is no project member
    OrgMembershipFactory(org=tenant.org, user=org_member, role=OrgRole.MEMBER)
    for client, detail in (
        (viewer, "Project viewers cannot cancel jobs; project members with any other role, "
                 "and org owners/admins, can."),
        (client_for(org_member), "Only project members (any role but viewer) and org owners/admins "
                                 "may cancel jobs here."),
    ):
        response = client.post(f"/api/v1/jobs/{job['id']}/cancel", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
        assert response.status_code == 403 and response.json()["detail"] == detail
    assert Job.objects.get(pk=job["id"]).state == "queued"


def test_org_admin_may_submit_without_project_membership(tenant: Tenant, job_body: Callable) -> None:
    assert post(client_for(tenant.admin), job_body()).status_code == 201


def test_hard_budget_rejects_naming_the_level(api: APIClient, job_body: Callable, tenant: Tenant) -> None:
    admin = client_for(tenant.admin)
    put = admin.put(f"/api/v1/projects/{tenant.project.pk}/budget",
                    {"period": "month", "limit": 3 * H100_PRICE, "enforcement": "hard"},
                    format="json", HTTP_IDEMPOTENCY_KEY="b1")
    assert put.status_code == 201, put.json()
    assert post(api, job_body(gpu_count=2)).status_code == 201
    response = post(api, job_body(gpu_count=2))
    assert response.status_code == 402
    body = response.json()
    assert body["type"] == "budget-exceeded" and body["level"] == "project"
    assert body["limit"] == 3 * H100_PRICE and body["used"] == 2 * H100_PRICE
    assert Job.objects.count() == 1


def test_soft_budget_accepts_and_alerts(api: APIClient, job_body: Callable, tenant: Tenant) -> None:
    client_for(tenant.admin).put(f"/api/v1/orgs/{tenant.org.pk}/budget",
                                 {"period": "month", "limit": 1, "enforcement": "soft"},
                                 format="json", HTTP_IDEMPOTENCY_KEY="b1")
    assert post(api, job_body()).status_code == 201
    alert = AuditEvent.objects.get(action="budget.soft_limit_exceeded")
    assert alert.data["level"] == "org" and alert.org_id == tenant.org.pk
    assert BudgetPeriod.objects.get().held == 2 * H100_PRICE
    # By the user whose API key submitted, as the submission's own event (QA: "System", no id).
    submit = AuditEvent.objects.get(action="sched.job.submit")
    assert (alert.actor_type, alert.actor_id) == ("user", str(tenant.user.pk))
    assert (submit.actor_type, submit.actor_id) == (alert.actor_type, alert.actor_id)


def test_a_requeue_past_a_soft_budget_alerts_as_the_system(api: APIClient, job_body: Callable,
                                                             tenant: Tenant) -> None:
    """A requeue's hold is placed by a scheduler pass, not by the job's user: its alert stays the system's."""
    from scheduling.services.reservation import reserve_job_hold

    job = Job.objects.get(pk=post(api, job_body()).json()["id"])
    client_for(tenant.admin).put(f"/api/v1/orgs/{tenant.org.pk}/budget",
                                 {"period": "month", "limit": 1, "enforcement": "soft"},
                                 format="json", HTTP_IDEMPOTENCY_KEY="b1")
    reserve_job_hold(job=job, key=f"job:{job.pk}:requeue:1")
    alert = AuditEvent.objects.get(action="budget.soft_limit_exceeded")
    assert (alert.actor_type, alert.actor_id) == ("system", "")


def test_body_size_is_capped(api: APIClient) -> None:
    raw = json.dumps({"name": "x" * 200_000}).encode()
    response = api.post("/api/v1/jobs", raw, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k")
    assert response.status_code == 400
    assert response.json()["max_bytes"] == 64 * 1024


def test_released_hold_stops_counting(api: APIClient, job_body: Callable) -> None:
    job_id = post(api, job_body()).json()["id"]
    cancel = api.post(f"/api/v1/jobs/{job_id}/cancel", format="json", HTTP_IDEMPOTENCY_KEY="c1")
    assert cancel.status_code == 200, cancel.json()
    assert cancel.json()["state"] == "cancelled"
    assert Hold.objects.get().state == HoldState.SETTLED
