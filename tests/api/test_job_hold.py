"""POST /jobs/{id}/hold and /release (Slurm's scontrol hold/release) and `held: true` at submission:
a held job keeps its credits held, is never scheduled, and its aging restarts at the release."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Membership, OrgRole
from audit.models import AuditEvent
from scheduling import core
from scheduling.adapter.snapshot import load_snapshot
from scheduling.adapter.writer import apply_result
from scheduling.models import Job, JobState
from scheduling.services.holding import hold_job
from scheduling.services.tick import run_scheduling_pass
from tests.api.conftest import client_for
from tests.api.factories import Tenant, make_tenant
from tests.api.test_job_dependencies import pending_ids, submit
from tests.api.test_jobs_submit import post

pytestmark = pytest.mark.django_db


def act(api: APIClient, job_id: int, verb: str, **extra: Any) -> Any:
    return api.post(f"/api/v1/jobs/{job_id}/{verb}", format="json", HTTP_IDEMPOTENCY_KEY=f"{verb}-{job_id}",
                    **extra)


def test_a_held_job_keeps_its_credits_and_waits_until_released(
    api: APIClient, job_body: Callable, tenant: Tenant
) -> None:
    job = submit(api, job_body)
    held = act(api, job["id"], "hold")
    assert held.status_code == 200
    body = held.json()
    assert body["held"] is True and body["wait_reason"] == "held"
    who = tenant.user.get_username()
    assert body["wait_detail"] == f"held by {who} until released (POST /api/v1/jobs/{job['id']}/release)"
    assert body["hold"]["state"] == "active" and body["hold"]["released"] == 0
    assert pending_ids() == set()
    run_scheduling_pass(trigger="test")
    assert Job.objects.get(pk=job["id"]).state == JobState.QUEUED  # never placed while held

    # Held for an hour (backdated: the test's transaction has one clock reading).
    Job.objects.filter(pk=job["id"]).update(submitted_at=timezone.now() - timedelta(hours=1))
    released = act(api, job["id"], "release").json()
    assert (released["held"], released["wait_reason"]) == (False, "")
    # Offered again, aging from the release: holding a job never buys it queue time.
    (pending,) = load_snapshot(now=timezone.now()).snapshot.pending
    fresh = Job.objects.get(pk=job["id"])
    assert pending.submitted_at == pytest.approx(fresh.aging_from.timestamp(), abs=1e-3)
    assert pending.submitted_at - fresh.submitted_at.timestamp() == pytest.approx(3600, abs=5)
    run_scheduling_pass(trigger="test")
    assert Job.objects.get(pk=job["id"]).state == JobState.SCHEDULED
    actions = list(AuditEvent.objects.filter(subject_id=str(job["id"]), action__startswith="sched.job.")
                   .order_by("id").values_list("action", flat=True))
    assert actions[1:3] == ["sched.job.hold", "sched.job.release"]


def test_submitted_held_then_released_shows_its_dependency_again(api: APIClient, job_body: Callable) -> None:
    first = submit(api, job_body)
    second = submit(api, job_body, depends_on=[first["id"]], held=True)
    assert (second["held"], second["wait_reason"]) == (True, "held")
    released = act(api, second["id"], "release").json()
    assert (released["wait_reason"], released["wait_detail"]) == (
        "dependency", f"after job {first['id']} completes (afterok)",
    )
    assert pending_ids() == {first["id"]}


def test_hold_and_release_are_idempotent_and_only_for_queued_jobs(api: APIClient, job_body: Callable) -> None:
    job = submit(api, job_body)
    assert act(api, job["id"], "release").json()["held"] is False  # not held: nothing to do
    assert act(api, job["id"], "hold").status_code == 200
    again = api.post(f"/api/v1/jobs/{job['id']}/hold", format="json", HTTP_IDEMPOTENCY_KEY="second-hold")
    assert again.status_code == 200 and again.json()["held"] is True
    Job.objects.filter(pk=job["id"]).update(state=JobState.RUNNING, held=False)
    refused = api.post(f"/api/v1/jobs/{job['id']}/hold", format="json", HTTP_IDEMPOTENCY_KEY="on-running")
    assert refused.status_code == 409 and refused.json()["type"] == "illegal-job-transition"
    assert refused.json()["detail"] == f"Job {job['id']} is running; only a queued job can be held."


def test_who_may_hold(api: APIClient, job_body: Callable, tenant: Tenant) -> None:
    job = submit(api, job_body)
    viewer = make_tenant().user
    Membership.objects.create(project=tenant.project, user=viewer, role=OrgRole.VIEWER)
    response = act(client_for(viewer), job["id"], "hold")
    assert response.status_code == 403
    assert response.json()["detail"].startswith("Project viewers cannot hold jobs")
    assert act(client_for(make_tenant().user), job["id"], "hold").status_code == 404
    assert api.post(f"/api/v1/jobs/{job['id']}/hold", {"x": 1}, format="json",
                    HTTP_IDEMPOTENCY_KEY="with-body").status_code == 400
    assert api.post(f"/api/v1/jobs/{job['id']}/hold").status_code == 400  # no Idempotency-Key
    assert Job.objects.get(pk=job["id"]).held is False


def test_a_job_held_while_a_pass_runs_is_not_placed_and_keeps_its_reason(
    api: APIClient, job_body: Callable, tenant: Tenant
) -> None:
    job = submit(api, job_body)
    loaded = load_snapshot(now=timezone.now())
    result = core.schedule(loaded.snapshot)
    assert [p.job_id for p in result.placements] == [job["id"]]
    hold_job(job=Job.objects.get(pk=job["id"]), actor=tenant.user)  # between the read and the write
    applied = apply_result(loaded=loaded, result=result)
    assert applied.conflicts == [job["id"]]
    fresh = Job.objects.get(pk=job["id"])
    assert (fresh.state, fresh.held, fresh.wait_reason) == (JobState.QUEUED, True, "held")


def test_held_is_validated_at_submission(api: APIClient, job_body: Callable) -> None:
    response = post(api, job_body(held="yes"))
    assert response.status_code == 400 and "held" in response.json()["errors"]


def test_cancelling_a_held_job_ends_the_hold_too(api: APIClient, job_body: Callable) -> None:
    job = submit(api, job_body, held=True)
    cancelled = act(api, job["id"], "cancel").json()
    assert (cancelled["state"], cancelled["held"], cancelled["hold"]["state"]) == (
        "cancelled", False, "settled",
    )


def test_release_refuses_a_job_that_is_not_queued_and_submission_audits_the_hold(
    api: APIClient, job_body: Callable
) -> None:
    """QA: releasing a cancelled job changed it and was audited; a job submitted held left no trace."""
    job = submit(api, job_body, held=True)
    submitted = AuditEvent.objects.get(action="sched.job.submit", subject_id=str(job["id"]))
    assert submitted.data["held"] is True
    Job.objects.filter(pk=job["id"]).update(state=JobState.CANCELLED)
    refused = act(api, job["id"], "release")
    assert refused.status_code == 409
    assert refused.json()["detail"] == f"Job {job['id']} is cancelled; only a queued job can be released."
    assert Job.objects.get(pk=job["id"]).held is True  # untouched
    assert not AuditEvent.objects.filter(action="sched.job.release", subject_id=str(job["id"])).exists()


def test_a_job_held_after_the_queue_was_ordered_has_no_position(
    api: APIClient, job_body: Callable, settings: Any
) -> None:
    """QA: for up to the cache's 5 s a just-held job kept its position ("#1 of 1 in the queue · held")."""
    from django.core.cache import cache

    from scheduling.selectors import CURRENT_KEY

    settings.SCHEDULER_QUEUE_VIEW_SECONDS = 60
    cache.delete(CURRENT_KEY)
    job = submit(api, job_body)
    try:
        assert api.get(f"/api/v1/jobs/{job['id']}/priority").json()["position"] == 1
        act(api, job["id"], "hold")
        body = api.get(f"/api/v1/jobs/{job['id']}/priority").json()
        assert (body["position"], body["wait_reason"]) == (None, "held")
    finally:
        cache.delete(CURRENT_KEY)


def test_only_an_operator_releases_an_operators_hold(
    api: APIClient, job_body: Callable, tenant: Tenant
) -> None:
    """QA (session 9): a user could release a hold an operator placed. As Slurm's admin hold, an
    operator's hold (the admin's Hold action) is released by an operator only; the user's own hold
    and release leave it as it is, and the user may still cancel the job."""
    from django.test import Client
    from django.urls import reverse

    from tests.factories import UserFactory

    job = submit(api, job_body)
    assert act(api, job["id"], "hold").json()["held_by_operator"] is False  # the user's own hold first
    operator = UserFactory(is_staff=True, is_superuser=True)
    staff = Client()
    staff.force_login(operator)
    changelist = reverse("admin:scheduling_job_changelist")
    staff.post(changelist, {"action": "hold", "_selected_action": [job["id"]]})
    body = api.get(f"/api/v1/jobs/{job['id']}").json()
    assert (body["held"], body["held_by_operator"], body["wait_detail"]) == (
        True, True, f"held by an operator ({operator.get_username()}) until an operator releases it",
    )
    refused = api.post(f"/api/v1/jobs/{job['id']}/release", HTTP_IDEMPOTENCY_KEY="user-release")
    assert refused.status_code == 403 and refused.json()["type"].endswith("held-by-operator")
    again = api.post(f"/api/v1/jobs/{job['id']}/hold", HTTP_IDEMPOTENCY_KEY="hold-again").json()
    assert again["held_by_operator"] is True  # the user's hold changes nothing
    assert Job.objects.get(pk=job["id"]).held is True

    staff.post(changelist, {"action": "release", "_selected_action": [job["id"]]})
    released = api.get(f"/api/v1/jobs/{job['id']}").json()
    assert (released["held"], released["held_by_operator"], released["wait_reason"]) == (False, False, "")
    events = list(AuditEvent.objects.filter(subject_id=str(job["id"]), action__in=("sched.job.hold",
                                                                                  "sched.job.release"))
                  .order_by("id").values_list("action", "actor_id", "data__operator"))
    assert events == [("sched.job.hold", str(tenant.user.pk), False),
                      ("sched.job.hold", str(operator.pk), True),
                      ("sched.job.release", str(operator.pk), True)]

    staff.post(changelist, {"action": "hold", "_selected_action": [job["id"]]})
    cancelled = act(api, job["id"], "cancel").json()  # an operator's hold does not take the job away
    assert (cancelled["state"], cancelled["held"], cancelled["held_by_operator"]) == (
        "cancelled", False, False,
    )


def test_the_database_refuses_an_operator_hold_that_is_not_a_hold(api: APIClient, job_body: Callable) -> None:
    from django.db import IntegrityError, transaction

    job = submit(api, job_body)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job["id"]).update(held=False, held_by_operator=True)


def test_a_held_job_names_its_own_release_route(api: APIClient, job_body: Callable, tenant: Tenant) -> None:
    """QA: the detail read '.../jobs/<id>/release', a placeholder, even for a job submitted held."""
    job = submit(api, job_body, held=True)
    assert job["wait_detail"].endswith(f"(POST /api/v1/jobs/{job['id']}/release)")
    assert api.get(f"/api/v1/jobs/{job['id']}").json()["wait_detail"] == job["wait_detail"]
