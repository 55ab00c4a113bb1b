"""Scheduling admin: every page renders; the node-token action shows the token once; quotas stay
within their org."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from importlib import import_module
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from scheduling.models import (
    MAX_PRICE,
    MAX_PRICE_MESSAGE,
    PRICE_MESSAGE,
    GpuPrice,
    Job,
    JobState,
    Node,
    Quota,
)
from tests.factories import OrganizationFactory, ProjectFactory
from tests.scheduling.conftest import H100_PRICE

pytestmark = pytest.mark.django_db

PAGES = ["gputype", "gpuprice", "node", "priorityclass", "quota", "job", "jobattempt", "allocation",
         "schedulerpass"]


@pytest.mark.parametrize("model", PAGES)
def test_changelists_render(staff: Client, fleet: dict[str, Any], make_job: Callable[..., Job],
                            model: str) -> None:
    job = make_job(JobState.QUEUED, wait_reason="resources")
    assert staff.get(reverse(f"admin:scheduling_{model}_changelist")).status_code == 200
    if model == "job":
        page = staff.get(reverse("admin:scheduling_job_change", args=[job.pk]))
        assert page.status_code == 200 and b"resources" in page.content


def test_issue_token_action(staff: Client, fleet: dict[str, Any]) -> None:
    node = fleet["node"]
    response = staff.post(reverse("admin:scheduling_node_changelist"),
                          {"action": "issue_token", "_selected_action": [node.pk]}, follow=True)
    assert response.status_code == 200
    node = Node.objects.get(pk=node.pk)
    assert node.token_prefix and node.token_prefix.encode() in response.content


def test_cancel_action_cancels_a_queued_job(staff: Client, fleet: dict[str, Any],
                                            make_job: Callable[..., Job]) -> None:
    job = make_job(JobState.QUEUED, hold=False)
    response = staff.post(reverse("admin:scheduling_job_changelist"),
                          {"action": "cancel", "_selected_action": [job.pk]}, follow=True)
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
    shown = [str(m) for m in response.context["messages"]]
    assert shown == ["1 job cancelled (a running one stops first)."]  # QA: a success said nothing


def test_a_price_in_effect_can_be_neither_changed_nor_deleted(staff: Client, fleet: dict[str, Any]) -> None:
    """Prices are history: holds and runs were priced from them (QA: an edited A100 price re-priced
    30 days of history, a deleted L4 price made L4 unsubmittable)."""
    h100 = fleet["h100"]
    current = GpuPrice.objects.get(gpu_type=h100)
    later = GpuPrice.objects.create(gpu_type=h100, price_per_gpu_hour=7_000_000,
                                    effective_from=timezone.now() + timedelta(days=3))
    change, delete = "admin:scheduling_gpuprice_change", "admin:scheduling_gpuprice_delete"
    edit = {"gpu_type": h100.pk, "price_per_gpu_hour": 1, "effective_from_0": "2026-01-01",
            "effective_from_1": "00:00"}
    assert staff.post(reverse(change, args=[current.pk]), edit).status_code == 403
    assert staff.post(reverse(delete, args=[current.pk]), {"post": "yes"}).status_code == 403
    staff.post(reverse("admin:scheduling_gpuprice_changelist"),
               {"action": "delete_selected", "_selected_action": [current.pk], "post": "yes"})
    assert GpuPrice.objects.get(pk=current.pk).price_per_gpu_hour == H100_PRICE  # untouched
    # A price not yet in effect may be corrected or withdrawn.
    assert staff.get(reverse(change, args=[later.pk])).context["has_change_permission"] is True
    assert staff.post(reverse(delete, args=[later.pk]), {"post": "yes"}).status_code == 302
    assert not GpuPrice.objects.filter(pk=later.pk).exists()
    # On the GPU type page, the existing prices are read-only: only new ones can be added.
    page = staff.get(reverse("admin:scheduling_gputype_change", args=[h100.pk]))
    formset = page.context["inline_admin_formsets"][0]
    assert formset.has_change_permission is False and formset.has_add_permission is True


def _quota_form(org: Any, project: Any, gpu_type: Any) -> dict[str, Any]:
    return {"org": org.pk, "project": project.pk if project else "", "gpu_type": gpu_type.pk, "max_gpus": 4}


def test_quota_admin_refuses_a_project_of_another_org(staff: Client, fleet: dict[str, Any]) -> None:
    acme, globex = OrganizationFactory(slug="acme"), OrganizationFactory(slug="globex")
    llm = ProjectFactory(org=acme, slug="llm")
    url = reverse("admin:scheduling_quota_add")
    response = staff.post(url, _quota_form(globex, llm, fleet["h100"]))
    assert response.status_code == 200  # the form again, with the error; nothing saved
    assert response.context["adminform"].form.errors["project"] == [
        "Project acme/llm belongs to organization acme, not globex: choose a project of this "
        "quota's organization, or none for an org-wide quota."
    ]
    assert not Quota.objects.exists()
    # The project's own org, or no project (org-wide), saves.
    for org, project in ((acme, llm), (globex, None)):
        assert staff.post(url, _quota_form(org, project, fleet["h100"])).status_code == 302
    assert set(Quota.objects.values_list("org__slug", "project__slug")) == {("acme", "llm"), ("globex", None)}


def test_quota_clean_checks_the_projects_org(fleet: dict[str, Any]) -> None:
    project = ProjectFactory()
    other = OrganizationFactory()
    with pytest.raises(ValidationError) as refused:
        Quota(org=other, project=project, gpu_type=fleet["h100"], max_gpus=1).full_clean()
    assert set(refused.value.message_dict) == {"project"}
    Quota(org=project.org, project=project, gpu_type=fleet["h100"], max_gpus=1).full_clean()
    Quota(org=other, project=None, gpu_type=fleet["h100"], max_gpus=1).full_clean()


def test_the_database_refuses_a_quota_naming_a_project_of_another_org(fleet: dict[str, Any]) -> None:
    """Rows written around `clean` (shell, scripts) are refused too (migration 0010, PostgreSQL)."""
    project, other = ProjectFactory(), OrganizationFactory()
    with pytest.raises(IntegrityError, match="quota_project_in_org"), transaction.atomic():
        Quota.objects.create(org=other, project=project, gpu_type=fleet["h100"], max_gpus=1)
    Quota.objects.create(org=project.org, project=project, gpu_type=fleet["h100"], max_gpus=1)
    Quota.objects.create(org=other, project=None, gpu_type=fleet["h100"], max_gpus=1)  # org-wide
    with pytest.raises(IntegrityError, match="quota_project_in_org"), transaction.atomic():
        Quota.objects.filter(project=project).update(org=other)


def test_the_migration_lists_wrong_rows_instead_of_deleting_them(fleet: dict[str, Any]) -> None:
    migration = import_module("scheduling.migrations.0010_quota_project_in_org")
    project, other = ProjectFactory(), OrganizationFactory()
    with connection.schema_editor() as editor:  # inside the test's transaction: rolled back after
        editor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # no pending FK checks before ALTER TABLE
        migration._drop(None, editor)
        wrong = Quota.objects.create(org=other, project=project, gpu_type=fleet["h100"], max_gpus=1)
        with pytest.raises(RuntimeError, match=rf"quota {wrong.pk} \(org {other.pk}\) names project"):
            migration._add(None, editor)
        assert Quota.objects.filter(pk=wrong.pk).exists()
        wrong.delete()
        editor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        migration._add(None, editor)


def test_a_projects_org_cannot_be_changed_in_the_admin(staff: Client, fleet: dict[str, Any]) -> None:
    """Its quotas, jobs and holds belong to its org; moving it would leave them behind."""
    acme = OrganizationFactory(slug="acme")
    llm = ProjectFactory(org=acme, slug="llm", name="LLM")
    url = reverse("admin:accounts_project_change", args=[llm.pk])
    form = staff.get(url).context["adminform"].form
    assert "org" not in form.fields  # shown read-only
    assert b"acme" in staff.get(url).content
    assert staff.get(reverse("admin:accounts_project_add")).context["adminform"].form.fields["org"]


def test_history_pages_are_read_only(staff: Client, fleet: dict[str, Any]) -> None:
    """QA: "Revert" on a price's history changed a price in effect (customers were charged 1
    micro-credit an hour); on a node's it lifted a cordon unaudited and wiped the agent's token."""
    price = GpuPrice.objects.get(gpu_type=fleet["h100"])
    version = price.history.first().history_id
    url = reverse("admin:scheduling_gpuprice_simple_history", args=[price.pk, version])
    assert staff.get(url).status_code == 200  # still viewable
    edit = {"gpu_type": fleet["h100"].pk, "price_per_gpu_hour": 1, "effective_from_0": "2026-01-01",
            "effective_from_1": "00:00"}
    assert staff.post(url, edit).status_code == 403
    assert GpuPrice.objects.get(pk=price.pk).price_per_gpu_hour == H100_PRICE
    node = fleet["node"]
    Node.objects.filter(pk=node.pk).update(cordon="down")
    node_version = node.history.first().history_id
    node_url = reverse("admin:scheduling_node_simple_history", args=[node.pk, node_version])
    assert staff.post(node_url, {"cordon": ""}).status_code == 403
    assert Node.objects.get(pk=node.pk).cordon == "down"


def test_a_price_cannot_be_back_dated(staff: Client, fleet: dict[str, Any]) -> None:
    """QA: a new price dated in the past became the price in effect at once and rewrote history;
    a scheduled price could be edited into the past."""
    add = reverse("admin:scheduling_gpuprice_add")
    past = timezone.now() - timedelta(days=3)
    form = {"gpu_type": fleet["h100"].pk, "price_per_gpu_hour": 5_000_000,
            "effective_from_0": past.strftime("%Y-%m-%d"), "effective_from_1": past.strftime("%H:%M:%S")}
    response = staff.post(add, form)
    assert response.status_code == 200  # the form again
    assert response.context["adminform"].form.errors["effective_from"] == [
        "A price takes effect now or later: prices are history (add a new one instead)."
    ]
    later = timezone.now() + timedelta(days=3)
    form.update(effective_from_0=later.strftime("%Y-%m-%d"), effective_from_1=later.strftime("%H:%M:%S"))
    assert staff.post(add, form).status_code == 302
    scheduled = GpuPrice.objects.get(price_per_gpu_hour=5_000_000)
    form.update(effective_from_0=past.strftime("%Y-%m-%d"), effective_from_1=past.strftime("%H:%M:%S"))
    change = reverse("admin:scheduling_gpuprice_change", args=[scheduled.pk])
    assert staff.post(change, form).status_code == 200
    assert GpuPrice.objects.get(pk=scheduled.pk).effective_from > timezone.now()


@pytest.mark.parametrize(("price", "message"), [
    ("0", PRICE_MESSAGE), ("-5", PRICE_MESSAGE),
    # QA: 2^63 - 1 was accepted, and every large submission was then a 500 (cost past 64 bits).
    (str(2**63 - 1), MAX_PRICE_MESSAGE), (str(MAX_PRICE + 1), MAX_PRICE_MESSAGE),
])
def test_a_price_that_is_not_positive_is_refused_by_the_field(staff: Client, fleet: dict[str, Any],
                                                              price: str, message: str) -> None:
    """QA: the admin answered with the raw "Constraint “gpu_price_positive” is violated."."""
    h100 = fleet["h100"]
    when = timezone.now() + timedelta(days=1)
    day, time = when.strftime("%Y-%m-%d"), when.strftime("%H:%M:%S")
    form = {"gpu_type": h100.pk, "price_per_gpu_hour": price,
            "effective_from_0": day, "effective_from_1": time}
    response = staff.post(reverse("admin:scheduling_gpuprice_add"), form)
    assert response.status_code == 200  # the form again, nothing saved
    errors = response.context["adminform"].form.errors
    assert errors == {"price_per_gpu_hour": [message]}
    assert "Constraint" not in response.content.decode()
    # The same on the GPU type page's inline for new prices.
    inline = {"name": h100.name, "memory_gb": h100.memory_gb, "prices-TOTAL_FORMS": "1",
              "prices-INITIAL_FORMS": "0", "prices-0-price_per_gpu_hour": price,
              "prices-0-effective_from_0": day, "prices-0-effective_from_1": time}
    page = staff.post(reverse("admin:scheduling_gputype_change", args=[h100.pk]), inline)
    assert page.status_code == 200
    formset = page.context["inline_admin_formsets"][0].formset
    assert formset.errors == [{"price_per_gpu_hour": [message]}]
    assert GpuPrice.objects.filter(gpu_type=h100).count() == 1  # the fleet's price only


def test_the_database_refuses_a_price_past_the_cap_written_around_the_validators(
        fleet: dict[str, Any]) -> None:
    GpuPrice.objects.create(gpu_type=fleet["h100"], price_per_gpu_hour=MAX_PRICE,
                            effective_from=timezone.now() + timedelta(days=1))
    with pytest.raises(IntegrityError, match="gpu_price_at_most_max"), transaction.atomic():
        GpuPrice.objects.filter(price_per_gpu_hour=MAX_PRICE).update(price_per_gpu_hour=MAX_PRICE + 1)


def test_a_refused_action_names_the_job_once(staff: Client, fleet: dict[str, Any],
                                             make_job: Callable[..., Job]) -> None:
    job = make_job(JobState.COMPLETED, hold=False)
    response = staff.post(reverse("admin:scheduling_job_changelist"),
                          {"action": "release", "_selected_action": [job.pk]}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert shown == [f"Job {job.pk} is completed; only a queued job can be released."]  # once, not twice


def test_quota_and_price_changes_are_in_the_audit_trail(staff: Client, fleet: dict[str, Any]) -> None:
    """QA: a `quota` wait could not be traced to who set the quota; only the history page knew."""
    from audit.models import AuditEvent

    org = OrganizationFactory()
    add = staff.post(reverse("admin:scheduling_quota_add"),
                     {"org": org.pk, "project": "", "gpu_type": fleet["h100"].pk, "max_gpus": 8})
    assert add.status_code == 302, add.content[:2000]
    quota = Quota.objects.get(org=org)
    staff.post(reverse("admin:scheduling_quota_change", args=[quota.pk]),
               {"org": org.pk, "project": "", "gpu_type": fleet["h100"].pk, "max_gpus": 4})
    staff.post(reverse("admin:scheduling_quota_delete", args=[quota.pk]), {"post": "yes"})
    events = list(AuditEvent.objects.filter(action__startswith="sched.quota.").order_by("id")
                  .values_list("action", "org_id", "data__fields"))
    assert events == [("sched.quota.added", org.pk, {"org": str(org), "gpu_type": "H100", "max_gpus": "8"}),
                      ("sched.quota.changed", org.pk, {"max_gpus": "4"}),
                      ("sched.quota.deleted", org.pk, None)]
    changed = AuditEvent.objects.get(action="sched.quota.changed")
    assert changed.data["before"] == {"max_gpus": "8"}  # and what it was
    when = timezone.now() + timedelta(days=1)
    price = {"gpu_type": fleet["h100"].pk, "price_per_gpu_hour": 9_000_000,
             "effective_from_0": when.strftime("%Y-%m-%d"), "effective_from_1": when.strftime("%H:%M:%S")}
    assert staff.post(reverse("admin:scheduling_gpuprice_add"), price).status_code == 302
    assert AuditEvent.objects.filter(action="sched.price.added").count() == 1


def test_releasing_a_job_that_is_not_held_says_so(staff: Client, fleet: dict[str, Any],
                                                  make_job: Callable[..., Job]) -> None:
    job = make_job(JobState.QUEUED, hold=False)
    response = staff.post(reverse("admin:scheduling_job_changelist"),
                          {"action": "release", "_selected_action": [job.pk]}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    assert shown == [f"Job {job.pk} is not held; nothing to release."]  # QA: said "1 job released"


def test_an_operator_plans_a_maintenance_window_on_a_node(staff: Client, fleet: dict[str, Any]) -> None:
    from audit.models import AuditEvent

    node = fleet["node"]
    url = reverse("admin:scheduling_node_change", args=[node.pk])
    start, end = timezone.now() + timedelta(hours=2), timezone.now() + timedelta(hours=4)
    form = {"name": node.name, "region": node.region_id, "gpu_type": node.gpu_type_id, "gpu_count": 8,
            "nvlink_domain": "", "ib_group": node.ib_group, "cordon": "",
            "allocations-TOTAL_FORMS": 0, "allocations-INITIAL_FORMS": 0}

    def window(a: Any, b: Any) -> dict[str, str]:
        out = {}
        for name, value in (("maintenance_from", a), ("maintenance_until", b)):
            out[f"{name}_0"] = value.strftime("%Y-%m-%d") if value else ""
            out[f"{name}_1"] = value.strftime("%H:%M:%S") if value else ""
        return out

    refused = staff.post(url, {**form, **window(end, start)})
    assert refused.status_code == 200 and b"The window must end after it starts." in refused.content
    half = staff.post(url, {**form, **window(start, None)})
    assert half.status_code == 200 and b"needs both a start and an end" in half.content
    past = staff.post(url, {**form, **window(start - timedelta(days=1), end - timedelta(days=1))})
    assert past.status_code == 200 and b"This window has already ended" in past.content  # QA
    assert staff.post(url, {**form, **window(start, end)}).status_code == 302
    node.refresh_from_db()
    assert node.maintenance_from is not None and abs((node.maintenance_from - start).total_seconds()) < 1
    event = AuditEvent.objects.get(action="sched.node.maintenance")
    assert event.actor_id and event.data["maintenance_from"]["from"] is None
    assert event.data["maintenance_until"]["to"].startswith(end.strftime("%Y-%m-%dT%H:%M:%S"))
    with pytest.raises(IntegrityError), transaction.atomic():  # and the database refuses half a window
        Node.objects.filter(pk=node.pk).update(maintenance_until=None)
    # A window that has passed since it was planned does not stop an edit of the node's other fields.
    old = (start - timedelta(days=1), end - timedelta(days=1))
    Node.objects.filter(pk=node.pk).update(maintenance_from=old[0], maintenance_until=old[1])
    edited = staff.post(url, {**form, **window(*old), "ib_group": "ib-other"})
    assert edited.status_code == 302
    assert Node.objects.get(pk=node.pk).ib_group == "ib-other"


def test_a_price_added_on_the_gpu_type_page_is_audited(staff: Client, fleet: dict[str, Any]) -> None:
    """QA: a price added inline on the GPU type page left no `sched.price.added` event."""
    from audit.models import AuditEvent

    h100 = fleet["h100"]
    when = timezone.now() + timedelta(days=2)
    page = staff.get(reverse("admin:scheduling_gputype_change", args=[h100.pk]))
    prefix = page.context["inline_admin_formsets"][0].formset.prefix
    existing = GpuPrice.objects.filter(gpu_type=h100).count()
    body = {"name": "H100", "memory_gb": 80,
            f"{prefix}-TOTAL_FORMS": existing + 1, f"{prefix}-INITIAL_FORMS": existing,
            f"{prefix}-MIN_NUM_FORMS": 0, f"{prefix}-MAX_NUM_FORMS": 1000}
    for i, price in enumerate(GpuPrice.objects.filter(gpu_type=h100).order_by("-effective_from")):
        body[f"{prefix}-{i}-id"] = price.pk
        body[f"{prefix}-{i}-gpu_type"] = h100.pk
    body.update({f"{prefix}-{existing}-price_per_gpu_hour": 7_000_000,
                 f"{prefix}-{existing}-effective_from_0": when.strftime("%Y-%m-%d"),
                 f"{prefix}-{existing}-effective_from_1": when.strftime("%H:%M:%S"),
                 f"{prefix}-{existing}-gpu_type": h100.pk})
    response = staff.post(reverse("admin:scheduling_gputype_change", args=[h100.pk]), body)
    assert response.status_code == 302, response.content[:3000]
    assert GpuPrice.objects.filter(gpu_type=h100, price_per_gpu_hour=7_000_000).exists()
    [event] = AuditEvent.objects.filter(action="sched.price.added")
    assert event.data["fields"]["price_per_gpu_hour"] == "7000000" and event.actor_id


def test_two_prices_typed_now_on_the_gpu_type_page_are_refused(staff: Client, fleet: dict[str, Any]) -> None:
    """QA: both were clamped to "now" microseconds apart, the first "in effect" for a millisecond."""
    h100 = fleet["h100"]
    url = reverse("admin:scheduling_gputype_change", args=[h100.pk])
    prefix = staff.get(url).context["inline_admin_formsets"][0].formset.prefix
    existing = list(GpuPrice.objects.filter(gpu_type=h100).order_by("-effective_from"))
    body: dict[str, Any] = {
        "name": "H100", "memory_gb": 80, f"{prefix}-TOTAL_FORMS": len(existing) + 2,
        f"{prefix}-INITIAL_FORMS": len(existing), f"{prefix}-MIN_NUM_FORMS": 0,
        f"{prefix}-MAX_NUM_FORMS": 1000,
    }
    for i, price in enumerate(existing):
        body[f"{prefix}-{i}-id"] = price.pk
        body[f"{prefix}-{i}-gpu_type"] = h100.pk
    now = timezone.now()
    for i, amount in ((len(existing), 900_000), (len(existing) + 1, 950_000)):
        body.update({f"{prefix}-{i}-price_per_gpu_hour": amount,
                     f"{prefix}-{i}-effective_from_0": now.strftime("%Y-%m-%d"),
                     f"{prefix}-{i}-effective_from_1": now.strftime("%H:%M:%S"),
                     f"{prefix}-{i}-gpu_type": h100.pk})
    refused = staff.post(url, body)
    assert refused.status_code == 200 and b"Only one new price can take effect now" in refused.content
    assert GpuPrice.objects.filter(gpu_type=h100).count() == len(existing)
    # One of them now and the other later: both saved.
    later = now + timedelta(hours=1)
    body[f"{prefix}-{len(existing) + 1}-effective_from_1"] = later.strftime("%H:%M:%S")
    body[f"{prefix}-{len(existing) + 1}-effective_from_0"] = later.strftime("%Y-%m-%d")
    assert staff.post(url, body).status_code == 302
    assert GpuPrice.objects.filter(gpu_type=h100).count() == len(existing) + 2


def test_a_registered_nodes_gpu_count_is_its_agents(staff: Client, fleet: dict[str, Any]) -> None:
    """QA: 12 GPUs typed on an 8-GPU node let the scheduler allocate indices 8-11; the agent refused
    them and the jobs failed. Once registered, the count is the agent's inventory."""
    node = fleet["node"]
    url = reverse("admin:scheduling_node_change", args=[node.pk])
    form = {"name": node.name, "region": node.region_id, "gpu_type": node.gpu_type_id, "gpu_count": 12,
            "nvlink_domain": "", "ib_group": node.ib_group, "cordon": "",
            "allocations-TOTAL_FORMS": 0, "allocations-INITIAL_FORMS": 0}
    Node.objects.filter(pk=node.pk).update(registered_at=timezone.now())
    assert staff.post(url, form).status_code == 302
    assert Node.objects.get(pk=node.pk).gpu_count == 8  # the field is read-only: ignored
    Node.objects.filter(pk=node.pk).update(registered_at=None)  # before its agent registers: editable
    assert staff.post(url, form).status_code == 302
    assert Node.objects.get(pk=node.pk).gpu_count == 12


def test_a_node_saved_in_the_admin_writes_only_what_the_operator_changed(
    staff: Client, fleet: dict[str, Any]
) -> None:
    """Review: a registered node's type was still editable (registration checked the GPUs' model
    against it). The save now names the changed fields only (the race with a heartbeat between the
    page's read and its write is not reproduced here)."""
    node = fleet["node"]
    url = reverse("admin:scheduling_node_change", args=[node.pk])
    Node.objects.filter(pk=node.pk).update(registered_at=timezone.now())
    page = staff.get(url)
    assert "gpu_type" not in page.context["adminform"].form.fields  # read-only once registered
    form = {"name": node.name, "nvlink_domain": "nv9", "ib_group": node.ib_group, "cordon": "",
            "allocations-TOTAL_FORMS": 0, "allocations-INITIAL_FORMS": 0}
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert staff.post(url, form).status_code == 302
    [update] = [q["sql"] for q in queries.captured_queries
                if q["sql"].startswith('UPDATE "scheduling_node"')]
    assert '"nvlink_domain"' in update and '"state"' not in update and '"last_heartbeat_at"' not in update
    assert Node.objects.get(pk=node.pk).nvlink_domain == "nv9"


def test_cancelling_a_job_that_is_already_cancelled_says_so(staff: Client, fleet: dict[str, Any],
                                                            make_job: Callable[..., Job]) -> None:
    ended = make_job(JobState.CANCELLED, hold=False)
    queued = make_job(JobState.QUEUED, hold=False)
    response = staff.post(reverse("admin:scheduling_job_changelist"),
                          {"action": "cancel", "_selected_action": [ended.pk, queued.pk]}, follow=True)
    shown = [str(m) for m in response.context["messages"]]
    # QA: said "2 jobs cancelled" although one had ended long before
    assert shown == [f"Job {ended.pk} has ended (cancelled); nothing to cancel.",
                     "1 job cancelled (a running one stops first)."]
    queued.refresh_from_db()
    assert queued.state == JobState.CANCELLED


def test_a_window_wholly_in_the_past_gets_one_error(staff: Client, fleet: dict[str, Any]) -> None:
    """QA: 2020-01-01 to 2020-01-02 was also told "needs both a start and an end" (the form's own
    error took the end out of what the model's check saw)."""
    node = fleet["node"]
    form = {"name": node.name, "region": node.region_id, "gpu_type": node.gpu_type_id, "gpu_count": 8,
            "nvlink_domain": "", "ib_group": node.ib_group, "cordon": "",
            "maintenance_from_0": "2020-01-01", "maintenance_from_1": "00:00",
            "maintenance_until_0": "2020-01-02", "maintenance_until_1": "00:00",
            "allocations-TOTAL_FORMS": 0, "allocations-INITIAL_FORMS": 0}
    response = staff.post(reverse("admin:scheduling_node_change", args=[node.pk]), form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert errors == {"maintenance_until": ["This window has already ended: plan one that ends later."]}
    assert Node.objects.get(pk=node.pk).maintenance_until is None  # nothing saved
