"""The fleet edited in the admin is in the audit trail: GPU types, nodes and regions added, changed
and deleted, by whom, with the fields before and after (QA: only Django's LogEntry had them)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import Region
from audit.models import AuditEvent
from scheduling.models import GpuType, Node, Quota
from tests.factories import OrganizationFactory

pytestmark = pytest.mark.django_db

NO_ALLOCATIONS = {"allocations-TOTAL_FORMS": 0, "allocations-INITIAL_FORMS": 0}


def _events(prefix: str) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(action__startswith=prefix).order_by("id"))


def _node_form(node: Node, **changes: Any) -> dict[str, Any]:
    form = {"name": node.name, "region": node.region_id, "gpu_type": node.gpu_type_id,
            "gpu_count": node.gpu_count, "nvlink_domain": node.nvlink_domain, "ib_group": node.ib_group,
            "cordon": node.cordon, **NO_ALLOCATIONS}
    return {**form, **changes}


def test_a_gpu_type_added_changed_and_deleted_is_audited(staff: Client, operator: Any) -> None:
    prefix = "prices"  # the inline's formset, empty
    inline = {f"{prefix}-TOTAL_FORMS": 0, f"{prefix}-INITIAL_FORMS": 0}
    added = staff.post(reverse("admin:scheduling_gputype_add"), {"name": "B200", "memory_gb": 192, **inline})
    assert added.status_code == 302, added.content[:2000]
    gpu = GpuType.objects.get(name="B200")
    url = reverse("admin:scheduling_gputype_change", args=[gpu.pk])
    assert staff.post(url, {"name": "B200", "memory_gb": 180, **inline}).status_code == 302
    assert staff.post(url, {"name": "B200", "memory_gb": 180, **inline}).status_code == 302  # no change
    delete = staff.post(reverse("admin:scheduling_gputype_delete", args=[gpu.pk]), {"post": "yes"})
    assert delete.status_code == 302
    events = _events("sched.gpu_type.")
    assert [(e.action, e.subject_id, e.actor_type, e.actor_id) for e in events] == [
        (f"sched.gpu_type.{verb}", str(gpu.pk), "user", str(operator.pk))
        for verb in ("added", "changed", "deleted")
    ]
    assert events[0].data["fields"] == {"name": "B200", "memory_gb": "192"}
    assert events[1].data["fields"] == {"memory_gb": "180"}
    assert events[1].data["before"] == {"memory_gb": "192"}


def test_a_node_added_changed_and_deleted_is_audited(staff: Client, operator: Any,
                                                     fleet: dict[str, Any]) -> None:
    other = Region.objects.create(code="us", name="US")
    body = {"name": "h100-2", "region": fleet["region"].pk, "gpu_type": fleet["h100"].pk, "gpu_count": 8,
            "nvlink_domain": "", "ib_group": "ib1", "cordon": "", **NO_ALLOCATIONS}
    added = staff.post(reverse("admin:scheduling_node_add"), body)
    assert added.status_code == 302, added.content[:2000]
    node = Node.objects.get(name="h100-2")
    changed = _node_form(node, gpu_count=4, ib_group="ib2", region=other.pk, gpu_type=fleet["a100"].pk)
    assert staff.post(reverse("admin:scheduling_node_change", args=[node.pk]), changed).status_code == 302
    delete = staff.post(reverse("admin:scheduling_node_delete", args=[node.pk]), {"post": "yes"})
    assert delete.status_code == 302 and not Node.objects.filter(pk=node.pk).exists()
    events = _events("sched.node.")
    assert [(e.action, e.subject_id, e.actor_id) for e in events] == [
        (f"sched.node.{verb}", str(node.pk), str(operator.pk)) for verb in ("added", "changed", "deleted")
    ]
    assert events[0].data["fields"] == {"name": "h100-2", "region": "eu", "gpu_type": "H100",
                                        "gpu_count": "8", "ib_group": "ib1"}
    assert events[1].data["fields"] == {"region": "us", "gpu_type": "A100", "gpu_count": "4",
                                        "ib_group": "ib2"}
    assert events[1].data["before"] == {"region": "eu", "gpu_type": "H100", "gpu_count": "8",
                                        "ib_group": "ib1"}
    assert events[2].data["object"] == "h100-2"


def test_a_cordon_set_on_the_node_page_is_audited_once(staff: Client, fleet: dict[str, Any]) -> None:
    """The cordon and the maintenance window have their own events (`sched.node.cordon|maintenance`):
    `sched.node.changed` names only the other fields, and is not written when only they changed."""
    node = fleet["node"]
    url = reverse("admin:scheduling_node_change", args=[node.pk])
    assert staff.post(url, _node_form(node, cordon="drain")).status_code == 302
    assert [e.action for e in _events("sched.node.")] == ["sched.node.cordon"]
    assert staff.post(url, _node_form(node, cordon="", nvlink_domain="nv2")).status_code == 302
    events = _events("sched.node.")
    assert [e.action for e in events] == ["sched.node.cordon", "sched.node.cordon", "sched.node.changed"]
    assert events[2].data["fields"] == {"nvlink_domain": "nv2"} and events[2].data["before"] == {
        "nvlink_domain": ""}


def test_a_region_added_changed_and_deleted_is_audited(staff: Client, operator: Any) -> None:
    assert staff.post(reverse("admin:accounts_region_add"), {"code": "ap", "name": "Asia"}).status_code == 302
    region = Region.objects.get(code="ap")
    url = reverse("admin:accounts_region_change", args=[region.pk])
    assert staff.post(url, {"code": "ap", "name": "Asia-Pacific"}).status_code == 302
    delete = staff.post(reverse("admin:accounts_region_delete", args=[region.pk]), {"post": "yes"})
    assert delete.status_code == 302
    events = _events("accounts.region.")
    assert [(e.action, e.actor_id) for e in events] == [
        (f"accounts.region.{verb}", str(operator.pk)) for verb in ("added", "changed", "deleted")
    ]
    assert events[1].data == {"object": "ap", "fields": {"name": "Asia-Pacific"}, "before": {"name": "Asia"}}


def test_a_gpu_type_with_quotas_is_not_deleted_until_they_are(staff: Client, operator: Any) -> None:
    """Review: deleting a GPU type deleted its quotas with it (a cascade: no `sched.quota.deleted`
    event, the org's caps gone unseen). As with its prices, the admin refuses and lists them; the
    quotas are deleted first, each audited, and then the type."""
    gpu = GpuType.objects.create(name="B200", memory_gb=192)
    quota = Quota.objects.create(org=OrganizationFactory(), gpu_type=gpu, max_gpus=8)
    url = reverse("admin:scheduling_gputype_delete", args=[gpu.pk])
    refused = staff.post(url, {"post": "yes"})
    assert refused.status_code == 200
    page = refused.content.decode()
    assert "would require deleting the following protected related objects" in page
    assert str(quota) in page
    changelist = reverse("admin:scheduling_gputype_changelist")
    bulk = staff.post(changelist, {"action": "delete_selected", "_selected_action": [gpu.pk], "post": "yes"})
    assert "would require deleting the following protected related objects" in bulk.content.decode()
    assert GpuType.objects.filter(pk=gpu.pk).exists() and Quota.objects.filter(pk=quota.pk).exists()
    assert _events("sched.gpu_type.") == [] and _events("sched.quota.") == []

    gone = staff.post(reverse("admin:scheduling_quota_delete", args=[quota.pk]), {"post": "yes"})
    assert gone.status_code == 302
    assert staff.post(url, {"post": "yes"}).status_code == 302
    assert not GpuType.objects.filter(pk=gpu.pk).exists()
    assert [(e.action, e.subject_id) for e in _events("sched.")] == [
        ("sched.quota.deleted", str(quota.pk)), ("sched.gpu_type.deleted", str(gpu.pk))]


def test_a_project_or_org_with_quotas_is_not_deleted_until_they_are(staff: Client) -> None:
    """Review: deleting a project (or an org) in the admin deleted its quotas with it, unaudited.
    As for a GPU type, the admin refuses and lists them; each quota goes by its audited delete."""
    from tests.factories import ProjectFactory

    gpu = GpuType.objects.create(name="B200", memory_gb=192)
    project = ProjectFactory()
    quota = Quota.objects.create(org=project.org, project=project, gpu_type=gpu, max_gpus=8)
    for name, obj in (("accounts_project", project), ("accounts_organization", project.org)):
        refused = staff.post(reverse(f"admin:{name}_delete", args=[obj.pk]), {"post": "yes"})
        assert "would require deleting the following protected related objects" in refused.content.decode()
        assert str(quota) in refused.content.decode()
    assert Quota.objects.filter(pk=quota.pk).exists() and _events("sched.quota.") == []
    gone = staff.post(reverse("admin:scheduling_quota_delete", args=[quota.pk]), {"post": "yes"})
    assert gone.status_code == 302
    assert [e.action for e in _events("sched.quota.")] == ["sched.quota.deleted"]
