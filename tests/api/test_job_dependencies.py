"""Job dependencies (Slurm's --dependency=afterok/afterany): submission checks, the scheduler offers
a job only once its dependencies have ended, and an afterok job whose dependency ends badly is
cancelled with its hold released."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import MICRO, Hold, HoldState, LedgerTransaction
from scheduling.adapter.snapshot import load_snapshot
from scheduling.models import Job, JobAttempt, JobState
from scheduling.services.dependencies import Link
from scheduling.services.lifecycle import cancel_job, cancel_orphaned_dependents, finish_attempt
from scheduling.services.tick import run_scheduling_pass
from tests.api.conftest import client_for
from tests.api.factories import Tenant, make_tenant
from tests.api.test_jobs_submit import post

pytestmark = pytest.mark.django_db


def submit(api: APIClient, job_body: Callable, **overrides: Any) -> dict[str, Any]:
    response = post(api, job_body(**overrides))
    assert response.status_code == 201, response.json()
    return response.json()


def refused(api: APIClient, body: dict[str, Any]) -> list[str]:
    before = (Job.objects.count(), Hold.objects.count(), LedgerTransaction.objects.count())
    response = post(api, body)
    assert response.status_code == 400, response.json()
    assert (Job.objects.count(), Hold.objects.count(), LedgerTransaction.objects.count()) == before
    assert list(response.json()["errors"]) == ["depends_on"]
    return response.json()["errors"]["depends_on"]


def pending_ids() -> set[int]:
    return {job.id for job in load_snapshot(now=timezone.now()).snapshot.pending}


def run(job_id: int) -> JobAttempt:
    """A pass places the job (the test fleet always has room); returns its live attempt."""
    run_scheduling_pass(trigger="test")
    job = Job.objects.get(pk=job_id)
    assert job.state == JobState.SCHEDULED, (job.state, job.wait_reason, job.wait_detail)
    return JobAttempt.objects.get(job=job, state__in=["scheduled", "running"])


def test_a_dependent_waits_until_its_dependency_completes(api: APIClient, job_body: Callable) -> None:
    first = submit(api, job_body, name="preprocess")
    second = submit(api, job_body, name="train", depends_on=[first["id"]])
    assert (second["depends_on"], second["dependency"]) == ([first["id"]], "afterok")
    assert (second["wait_reason"], second["wait_detail"]) == (
        "dependency", f"after job {first['id']} completes (afterok)",
    )
    assert first["depends_on"] == [] and first["dependency"] is None
    assert second["hold"]["state"] == "active"  # held at submission like any job
    assert api.get(f"/api/v1/jobs/{second['id']}").json()["depends_on"] == [first["id"]]

    assert pending_ids() == {first["id"]}  # the dependent is not offered to the scheduler
    attempt = run(first["id"])
    assert Job.objects.get(pk=second["id"]).state == JobState.QUEUED
    finish_attempt(attempt=attempt, outcome="completed", exit_code=0)
    # Offered now, and aging counts from when the dependency ended, not from submission (set an
    # hour back here, so the two differ).
    Job.objects.filter(pk=second["id"]).update(submitted_at=timezone.now() - timedelta(hours=1))
    (pending,) = load_snapshot(now=timezone.now()).snapshot.pending
    assert pending.id == second["id"]
    ended = Job.objects.get(pk=first["id"]).finished_at.timestamp()
    assert pending.submitted_at == pytest.approx(ended, abs=1e-3)
    # Running, it keeps that start for the victim rule's queue position.
    run(second["id"])
    (running,) = load_snapshot(now=timezone.now()).snapshot.running
    assert running.submitted_at == pytest.approx(ended, abs=1e-3)


def test_afterany_runs_after_a_failed_dependency(
    api: APIClient, job_body: Callable, django_capture_on_commit_callbacks: Any
) -> None:
    first = submit(api, job_body)
    second = submit(api, job_body, depends_on=[first["id"]], dependency="afterany")
    assert second["wait_detail"] == f"after job {first['id']} ends (afterany)"
    with django_capture_on_commit_callbacks(execute=True):
        finish_attempt(attempt=run(first["id"]), outcome="failed", exit_code=3)
    assert Job.objects.get(pk=second["id"]).state == JobState.QUEUED
    run(second["id"])


def test_afterok_chain_is_cancelled_when_the_first_job_fails_and_holds_are_released(
    api: APIClient, job_body: Callable, django_capture_on_commit_callbacks: Any
) -> None:
    first = submit(api, job_body)
    second = submit(api, job_body, depends_on=[first["id"]])
    third = submit(api, job_body, depends_on=[second["id"]])
    other = submit(api, job_body, depends_on=[first["id"]], dependency="afterany")
    with django_capture_on_commit_callbacks(execute=True):
        finish_attempt(attempt=run(first["id"]), outcome="failed", exit_code=1)
    for job_id in (second["id"], third["id"]):
        job = Job.objects.select_related("current_hold").get(pk=job_id)
        assert (job.state, job.end_reason, job.wait_reason) == (JobState.CANCELLED, "dependency-failed", "")
        hold = job.current_hold
        assert hold.state == HoldState.SETTLED and hold.released == hold.authorized and hold.captured == 0
    # QA: end_detail was empty; it names the dependency and how it ended
    assert Job.objects.get(pk=second["id"]).end_detail == (
        f"job {first['id']} it depends on (afterok) ended failed")
    assert Job.objects.get(pk=third["id"]).end_detail == (
        f"job {second['id']} it depends on (afterok) ended cancelled")
    assert Job.objects.get(pk=other["id"]).state == JobState.QUEUED  # afterany still runs


def test_cancelling_a_dependency_cancels_its_afterok_dependents(
    api: APIClient, job_body: Callable, tenant: Tenant, django_capture_on_commit_callbacks: Any
) -> None:
    first = submit(api, job_body)
    second = submit(api, job_body, depends_on=[first["id"]])
    with django_capture_on_commit_callbacks(execute=True):
        cancel_job(job=Job.objects.get(pk=first["id"]), actor=tenant.user)
    dependent = Job.objects.get(pk=second["id"])
    assert dependent.end_reason == "dependency-failed"
    assert dependent.end_detail == f"job {first['id']} it depends on (afterok) ended cancelled"


def test_a_dependent_that_missed_the_cascade_is_cancelled_by_the_sweep(
    api: APIClient, job_body: Callable, tenant: Tenant
) -> None:
    first = submit(api, job_body)
    second = submit(api, job_body, depends_on=[first["id"]])
    cancel_job(job=Job.objects.get(pk=first["id"]), actor=tenant.user)  # callbacks never run
    assert Job.objects.get(pk=second["id"]).state == JobState.QUEUED
    assert pending_ids() == set()  # never offered: its afterok dependency did not complete
    assert cancel_orphaned_dependents() == 1
    job = Job.objects.select_related("current_hold").get(pk=second["id"])
    assert job.state == JobState.CANCELLED and job.current_hold.state == HoldState.SETTLED
    assert job.end_detail == f"job {first['id']} it depends on (afterok) ended cancelled"
    assert cancel_orphaned_dependents() == 0


def test_bad_dependencies_are_refused_and_nothing_is_written(
    api: APIClient, job_body: Callable, tenant: Tenant
) -> None:
    other = make_tenant(funds=1000 * MICRO)
    foreign = submit(client_for(other.user), job_body, project=other.project.pk)
    mine = submit(api, job_body)
    assert refused(api, job_body(depends_on=[foreign["id"], 10**9])) == [
        f"Unknown job {foreign['id']}.", f"Unknown job {10**9}.",  # invisible jobs are unknown
    ]
    assert refused(api, job_body(depends_on=[mine["id"], mine["id"]])) == ["Dependencies must not repeat."]
    cancel_job(job=Job.objects.get(pk=mine["id"]), actor=tenant.user)
    assert refused(api, job_body(depends_on=[mine["id"]])) == [
        f"Job {mine['id']} ended cancelled: an afterok dependency on it can never be met."
    ]
    # afterany accepts an ended job, and is offered at once.
    accepted = submit(api, job_body, depends_on=[mine["id"]], dependency="afterany")
    assert accepted["wait_reason"] == "" and accepted["id"] in pending_ids()


def test_a_job_of_another_org_visible_to_finance_is_refused(job_body: Callable, tenant: Tenant) -> None:
    other = make_tenant(funds=1000 * MICRO)
    foreign = submit(client_for(other.user), job_body, project=other.project.pk)
    # The org's admin is in finance too, so they see every job; dependencies still stay in one org.
    tenant.admin.groups.add(Group.objects.get_or_create(name="finance")[0])
    assert refused(client_for(tenant.admin), job_body(depends_on=[foreign["id"]])) == [
        f"Job {foreign['id']} belongs to another organization."
    ]


@pytest.mark.parametrize(
    ("body", "field_error"),
    [({"depends_on": list(range(1, 18))}, "Ensure this field has no more than 16 elements."),
     ({"depends_on": [0]}, "Ensure this value is greater than or equal to 1."),
     ({"dependency": "after"}, '"after" is not a valid choice.')],
)
def test_malformed_dependencies_are_400(
    api: APIClient, job_body: Callable, body: dict[str, Any], field_error: str
) -> None:
    response = post(api, job_body(**body))
    assert response.status_code == 400
    assert field_error in str(response.json()["errors"])


def test_the_backoff_of_a_dependent_and_its_links_are_kept(api: APIClient, job_body: Callable) -> None:
    first = submit(api, job_body)
    second = submit(api, job_body, depends_on=[first["id"]])
    assert list(Link.objects.filter(from_job_id=second["id"]).values_list("to_job_id", flat=True)) == [
        first["id"]
    ]
    Job.objects.filter(pk=second["id"]).update(not_before=timezone.now() + timedelta(hours=1))
    assert pending_ids() == {first["id"]}


def test_dependency_needs_depends_on_and_null_means_afterok(api: APIClient, job_body: Callable) -> None:
    """QA: `dependency` without `depends_on` was dropped silently; `null` (what responses carry) was
    refused as input."""
    response = post(api, job_body(dependency="afterany"))
    assert response.status_code == 400
    assert response.json()["errors"] == {"dependency": ["Only with depends_on (the jobs to wait for)."]}
    first = submit(api, job_body)
    second = submit(api, job_body, depends_on=[first["id"]], dependency=None)
    assert second["dependency"] == "afterok"
    assert submit(api, job_body, dependency=None)["dependency"] is None


def test_job_routes_without_query_parameters_refuse_them(
    api: APIClient, job_body: Callable, tenant: Tenant
) -> None:
    job = submit(api, job_body)
    for url in (f"/api/v1/jobs/{job['id']}?x=1", f"/api/v1/jobs/{job['id']}/priority?fields=all"):
        response = api.get(url)
        assert response.status_code == 400, url
        assert list(response.json()["errors"].values()) == [["Unknown query parameter."]]
    org_url = f"/api/v1/orgs/{tenant.org.pk}/fair-share?org=1"
    assert client_for(tenant.admin).get(org_url).status_code == 400


def test_the_wait_detail_names_only_the_jobs_still_waited_for(
    api: APIClient, job_body: Callable, django_capture_on_commit_callbacks: Any
) -> None:
    """QA: after one of two dependencies completed, the detail still named both."""
    first, second = submit(api, job_body), submit(api, job_body)
    third = submit(api, job_body, depends_on=[first["id"], second["id"]])
    assert third["wait_detail"] == f"after jobs {first['id']}, {second['id']} complete (afterok)"
    with django_capture_on_commit_callbacks(execute=True):
        finish_attempt(attempt=run(first["id"]), outcome="completed", exit_code=0)
    job = Job.objects.get(pk=third["id"])
    assert (job.wait_reason, job.wait_detail) == (
        "dependency", f"after job {second['id']} completes (afterok)",
    )
    with django_capture_on_commit_callbacks(execute=True):
        finish_attempt(attempt=run(second["id"]), outcome="completed", exit_code=0)
    assert Job.objects.get(pk=third["id"]).wait_reason == ""  # met: the next pass says what it waits for
