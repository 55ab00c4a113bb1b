"""GET /api/v1/gpu-types (Slurm's sinfo) and GET /api/v1/orgs/{id}/quotas (Kueue's ClusterQueue
status): what a user reads before submitting, and while a job waits for its quota."""

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Region
from ledger.models import MICRO
from scheduling.models import GpuPrice, GpuType, Node, NodeCordon, NodeState, Quota
from tests.api.conftest import A100_PRICE, H100_PRICE, client_for
from tests.api.factories import Tenant, add_member, make_tenant
from tests.api.test_job_dependencies import run, submit
from tests.factories import ProjectFactory

pytestmark = pytest.mark.django_db


def _by_name(body: dict) -> dict[str, dict]:
    return {row["name"]: row for row in body["gpu_types"]}


def test_gpu_types_give_price_capacity_and_what_is_free_now(
    api: APIClient, job_body: Callable, fleet: dict[str, GpuType]
) -> None:
    eu = Region.objects.get(code="eu")
    Node.objects.create(name="h100-small", region=eu, gpu_type=fleet["H100"], gpu_count=8,
                        state=NodeState.DOWN)
    Node.objects.create(name="h100-drained", region=eu, gpu_type=fleet["H100"], gpu_count=8,
                        state=NodeState.READY, cordon=NodeCordon.DRAIN)
    later = timezone.now() + timedelta(days=3)
    GpuPrice.objects.create(gpu_type=fleet["H100"], effective_from=later, price_per_gpu_hour=5 * MICRO)
    job = submit(api, job_body, gpu_types=["H100"], gpu_count=4)
    run(job["id"])

    response = api.get("/api/v1/gpu-types")

    assert response.status_code == 200
    h100 = _by_name(response.json())["H100"]
    assert (h100["memory_gb"], h100["price_per_gpu_hour"]) == (80, H100_PRICE)
    assert h100["next_price"]["price_per_gpu_hour"] == 5 * MICRO
    assert h100["regions"] == ["eu", "us"]
    assert h100["nodes"] == {"ready": 2, "draining": 1, "unknown": 0, "down": 1}
    # Two ready 1,024-GPU nodes (the test fleet), a down and a drained node of 8.
    assert (h100["gpus"], h100["ready_gpus"], h100["in_use_gpus"]) == (2 * 1024 + 16, 2048, 4)
    assert h100["free_gpus"] == 2048 - 4 and h100["largest_free_on_one_node"] == 1024
    a100 = _by_name(response.json())["A100"]
    assert (a100["price_per_gpu_hour"], a100["next_price"], a100["in_use_gpus"]) == (A100_PRICE, None, 0)

    # A ready node inside its maintenance window counts as draining, as the scheduler sees it.
    Node.objects.filter(name="h100-drained").update(cordon="")
    Node.objects.create(name="h100-maintenance", region=eu, gpu_type=fleet["H100"], gpu_count=8,
                        state=NodeState.READY, maintenance_from=timezone.now() - timedelta(minutes=5),
                        maintenance_until=timezone.now() + timedelta(hours=1))
    h100 = _by_name(api.get("/api/v1/gpu-types").json())["H100"]
    assert h100["nodes"] == {"ready": 3, "draining": 1, "unknown": 0, "down": 1}


def test_gpu_types_take_no_parameters(api: APIClient) -> None:
    response = api.get("/api/v1/gpu-types?region=eu")
    assert response.status_code == 400 and "region" in response.json()["errors"]
    assert APIClient().get("/api/v1/gpu-types").status_code in (401, 403)


def test_quotas_show_use_and_queued_demand_per_scope(
    api: APIClient, job_body: Callable, tenant: Tenant, fleet: dict[str, GpuType]
) -> None:
    other_project = ProjectFactory(org=tenant.org)
    Quota.objects.create(org=tenant.org, gpu_type=fleet["H100"], max_gpus=16)
    Quota.objects.create(org=tenant.org, project=tenant.project, gpu_type=fleet["H100"], max_gpus=6)
    Quota.objects.create(org=tenant.org, project=other_project, gpu_type=fleet["A100"], max_gpus=8)
    running = submit(api, job_body, gpu_types=["H100"], gpu_count=4)
    run(running["id"])
    submit(api, job_body, gpu_types=["H100"], gpu_count=4)  # over the project's 6: waits for quota
    submit(api, job_body, gpu_types=["A100"], gpu_count=2)  # cannot run on H100: not H100 demand

    body = client_for(tenant.admin).get(f"/api/v1/orgs/{tenant.org.pk}/quotas").json()

    assert body["org"] == tenant.org.pk
    rows = [(q["gpu_type"], q["project"], q["max_gpus"], q["in_use_gpus"], q["available_gpus"],
             q["queued_jobs"], q["queued_gpus"]) for q in body["quotas"]]
    assert rows == [
        ("H100", None, 16, 4, 12, 1, 4),  # org-wide first
        ("A100", other_project.pk, 8, 0, 8, 0, 0),  # the A100 job is in the other project
        ("H100", tenant.project.pk, 6, 4, 2, 1, 4),
    ]
    assert body["quotas"][2]["project_slug"] == tenant.project.slug


def test_who_sees_which_quotas(api: APIClient, tenant: Tenant, fleet: dict[str, GpuType]) -> None:
    other_project = ProjectFactory(org=tenant.org)
    Quota.objects.create(org=tenant.org, gpu_type=fleet["H100"], max_gpus=16)
    Quota.objects.create(org=tenant.org, project=tenant.project, gpu_type=fleet["H100"], max_gpus=6)
    Quota.objects.create(org=tenant.org, project=other_project, gpu_type=fleet["H100"], max_gpus=4)
    url = f"/api/v1/orgs/{tenant.org.pk}/quotas"

    # A project-only member: the org-wide quota and their own project's, not another project's.
    mine = [(q["project"], q["max_gpus"]) for q in api.get(url).json()["quotas"]]
    assert mine == [(None, 16), (tenant.project.pk, 6)]
    viewer = add_member(other_project)
    assert [q["project"] for q in client_for(viewer).get(url).json()["quotas"]] == [None, other_project.pk]
    # The org's admin sees all three; another org's admin does not see the org at all.
    assert len(client_for(tenant.admin).get(url).json()["quotas"]) == 3
    assert client_for(make_tenant().admin).get(url).status_code == 404
    assert api.get(url + "?project=1").status_code == 400


def test_an_org_without_quotas_has_an_empty_list(tenant: Tenant) -> None:
    body = client_for(tenant.admin).get(f"/api/v1/orgs/{tenant.org.pk}/quotas").json()
    assert body["quotas"] == []
