"""Restricted priority classes (QA): `production` is never preempted and preempts others, so only
organizations granted it may submit jobs of it, as a Slurm association's QOS list. Any member of
any org could pin GPUs and preempt other orgs' jobs by naming it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from ledger.models import MICRO
from scheduling.models import Job, PriorityClass, PriorityGrant
from scheduling.pricing import catalog
from tests.api.conftest import client_for
from tests.api.factories import make_tenant
from tests.api.test_jobs_submit import nothing_written, post
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def ungranted(fleet: dict[str, Any]) -> Any:
    return make_tenant(funds=1000 * MICRO)


def _body(tenant: Any, **overrides: Any) -> dict[str, Any]:
    return {"project": tenant.project.pk, "name": "train", "gpu_types": ["H100"], "gpu_count": 1,
            "max_wall_seconds": 600, "priority_class": "production", **overrides}


def test_the_migration_restricts_production_only() -> None:
    restricted = dict(PriorityClass.objects.values_list("name", "restricted"))
    assert restricted.pop("production") is True
    assert set(restricted.values()) == {False}


@pytest.mark.parametrize("in_sql", [True, False])
def test_an_org_not_granted_production_is_refused_and_nothing_is_written(
    ungranted: Any, settings: Any, in_sql: bool
) -> None:
    settings.JOBS_SUBMIT_IN_SQL = in_sql
    response = post(client_for(ungranted.user), _body(ungranted))
    assert response.status_code == 403, response.json()
    body = response.json()
    assert body["type"] == "permission-denied"
    assert "restricted to the organizations granted it" in body["detail"]
    nothing_written()
    # Other classes are open to it.
    assert post(client_for(ungranted.user), _body(ungranted, priority_class="premium")).status_code == 201


def test_a_grant_in_the_admin_is_audited_and_lets_the_org_submit(ungranted: Any, client: Client) -> None:
    api = client_for(ungranted.user)
    assert post(api, _body(ungranted)).status_code == 403
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    production = PriorityClass.objects.get(name="production")
    added = client.post(reverse("admin:scheduling_prioritygrant_add"),
                        {"org": ungranted.org.pk, "priority_class": production.pk})
    assert added.status_code == 302
    event = AuditEvent.objects.get(action="sched.priority_grant.added")
    assert event.data["fields"]["org"] == str(ungranted.org)
    response = post(api, _body(ungranted))
    assert response.status_code == 201, response.json()
    assert Job.objects.get().priority_class == production


def test_the_admin_offers_only_restricted_classes_to_grant(client: Client) -> None:
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    page = client.get(reverse("admin:scheduling_prioritygrant_add"))
    offered = page.context["adminform"].form.fields["priority_class"].queryset
    assert [cls.name for cls in offered] == ["production"]


def test_a_grant_made_by_another_process_is_seen_at_once(
    ungranted: Any, django_capture_on_commit_callbacks: Callable[..., Any]
) -> None:
    """The catalog is cached per process; a grant written elsewhere (no signal here) is looked up
    before a refusal, so the org need not wait for the cache to expire."""
    catalog()  # warm: production is restricted and the org is not granted it
    PriorityGrant.objects.bulk_create([PriorityGrant(  # no post_save: as if from another process
        org=ungranted.org, priority_class=PriorityClass.objects.get(name="production"))])
    response = post(client_for(ungranted.user), _body(ungranted))
    assert response.status_code == 201, response.json()


def test_the_classes_say_which_of_the_callers_orgs_may_use_each(tenant: Any, ungranted: Any) -> None:
    """GET /priority-classes: a user of two orgs, one granted production (the `tenant` fixture's)."""
    from tests.factories import MembershipFactory

    MembershipFactory(project=ungranted.project, user=tenant.user)
    response = client_for(tenant.user).get("/api/v1/priority-classes")
    assert response.status_code == 200
    classes = {c["name"]: c for c in response.json()["priority_classes"]}
    assert list(classes) == ["production", "premium", "standard", "batch", "interactive"]  # highest first
    mine = sorted([tenant.org.pk, ungranted.org.pk])
    assert classes["production"] == {"name": "production", "rank": 500, "preemptible": False,
                                     "can_preempt": True, "restricted": True, "your_orgs": [tenant.org.pk]}
    assert classes["batch"]["your_orgs"] == mine and classes["batch"]["restricted"] is False
    assert client_for(ungranted.user).get("/api/v1/priority-classes").json()["priority_classes"][0][
        "your_orgs"] == []


def test_a_grant_cannot_be_moved_to_another_org(tenant: Any, ungranted: Any, client: Client) -> None:
    """QA: moving a grant was one `changed` event filed under the new org; acme's loss unrecorded."""
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    grant = PriorityGrant.objects.get(org=tenant.org)
    url = reverse("admin:scheduling_prioritygrant_change", args=[grant.pk])
    client.post(url, {"org": ungranted.org.pk, "priority_class": grant.priority_class_id})
    assert PriorityGrant.objects.get(pk=grant.pk).org == tenant.org
    assert not AuditEvent.objects.filter(action="sched.priority_grant.changed", data__fields__has_key="org")


def test_queued_jobs_of_an_org_whose_grant_is_revoked_wait_until_it_is_granted_again(
    tenant: Any, client: Client
) -> None:
    """Review: a revoked grant only stopped new submissions; the org's queued `production` jobs
    were still placed, unpreemptible, and could preempt other orgs' work. They now wait (Slurm
    leaves a job whose QOS its association lost pending), holding their credits, out of the queue."""
    from scheduling.services.tick import run_scheduling_pass

    api = client_for(tenant.user)
    response = post(api, _body(tenant))
    assert response.status_code == 201, response.json()
    job_id = response.json()["id"]
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    grant = PriorityGrant.objects.get(org=tenant.org)
    deleted = client.post(reverse("admin:scheduling_prioritygrant_delete", args=[grant.pk]), {"post": "yes"})
    assert deleted.status_code == 302 and not PriorityGrant.objects.filter(org=tenant.org)

    run_scheduling_pass(trigger="test")
    job = Job.objects.get(pk=job_id)
    assert job.state == "queued"
    assert job.wait_reason == "class-not-granted"
    assert job.wait_detail == (f"priority class production is no longer granted to {tenant.org.name}: an "
                               "administrator may grant it again, or cancel the job and submit it in "
                               "another class")
    assert job.current_hold.state == "active" and job.current_hold.released == 0
    skip = AuditEvent.objects.get(action="sched.skip", subject_id=str(job_id))
    assert skip.reason_code == "class-not-granted" and skip.data["previous"] == ""
    run_scheduling_pass(trigger="test")  # unchanged: no second event
    assert AuditEvent.objects.filter(action="sched.skip", subject_id=str(job_id)).count() == 1
    standing = api.get(f"/api/v1/jobs/{job_id}/priority").json()
    assert standing["wait_reason"] == "class-not-granted" and standing["position"] is None

    added = client.post(reverse("admin:scheduling_prioritygrant_add"),
                        {"org": tenant.org.pk, "priority_class": grant.priority_class_id})
    assert added.status_code == 302
    run_scheduling_pass(trigger="test")
    assert Job.objects.get(pk=job_id).state == "scheduled"


def test_a_class_restricted_after_submission_holds_back_the_jobs_of_orgs_not_granted_it(
    ungranted: Any,
) -> None:
    from scheduling.services.tick import run_scheduling_pass

    response = post(client_for(ungranted.user), _body(ungranted, priority_class="premium"))
    assert response.status_code == 201, response.json()
    PriorityClass.objects.filter(name="premium").update(restricted=True)
    run_scheduling_pass(trigger="test")
    job = Job.objects.get(pk=response.json()["id"])
    assert (job.state, job.wait_reason) == ("queued", "class-not-granted")


def test_a_job_waiting_for_funds_is_not_funded_while_its_class_is_not_granted(tenant: Any) -> None:
    """Review: the funding retry gave a hold to a job that cannot run (its org lost the grant),
    locking credits for nothing; it is funded once the class is granted again."""
    from ledger.services import release_hold
    from scheduling.services.lifecycle import fund_waiting_jobs

    response = post(client_for(tenant.user), _body(tenant))
    job = Job.objects.get(pk=response.json()["id"])
    release_hold(hold=job.current_hold, key="test-release")  # as a requeue refused for funds leaves it
    Job.objects.filter(pk=job.pk).update(current_hold=None)
    PriorityGrant.objects.filter(org=tenant.org).delete()
    assert fund_waiting_jobs() == 0
    assert Job.objects.get(pk=job.pk).current_hold_id is None
    PriorityGrant.objects.create(org=tenant.org, priority_class=PriorityClass.objects.get(name="production"))
    assert fund_waiting_jobs() == 1


def test_releasing_a_held_job_whose_class_is_not_granted_says_so_at_once(tenant: Any) -> None:
    """QA: the release blanked the wait reason until the next pass."""
    api = client_for(tenant.user)
    job_id = post(api, _body(tenant)).json()["id"]
    PriorityGrant.objects.filter(org=tenant.org).delete()
    assert api.post(f"/api/v1/jobs/{job_id}/hold", format="json", HTTP_IDEMPOTENCY_KEY="h").status_code == 200
    released = api.post(f"/api/v1/jobs/{job_id}/release", format="json", HTTP_IDEMPOTENCY_KEY="r").json()
    assert released["wait_reason"] == "class-not-granted"
    assert released["wait_detail"].startswith("priority class production is no longer granted to")
