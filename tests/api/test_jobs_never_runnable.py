"""POST /api/v1/jobs refuses a job that could never run (fleet shape, regions, quotas): 400, the
reason per GPU type, and nothing written — instead of a job that waits forever with credits held."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Region
from ledger.models import Hold, LedgerTransaction
from scheduling.models import GpuPrice, GpuType, Job, Node, NodeState, Quota
from scheduling.pricing import catalog
from tests.api.factories import Tenant
from tests.api.test_jobs_submit import post

pytestmark = pytest.mark.django_db


@pytest.fixture
def t4(fleet: dict[str, GpuType]) -> GpuType:
    """T4: two 8-GPU nodes in one IB group in eu, one more (no group) in eu, one node down in eu."""
    gpu = GpuType.objects.create(name="T4", memory_gb=16)
    GpuPrice.objects.create(gpu_type=gpu, price_per_gpu_hour=300_000,
                            effective_from=timezone.now() - timedelta(days=1))
    eu = Region.objects.get(code="eu")
    for i, (group, state) in enumerate(
        [("ib-a", NodeState.READY), ("ib-a", NodeState.DOWN), ("", NodeState.READY)]
    ):
        Node.objects.create(name=f"t4-{i}", region=eu, gpu_type=gpu, gpu_count=8, ib_group=group, state=state)
    return gpu


def refused(api: APIClient, body: dict[str, Any], field: str) -> dict[str, Any]:
    """Submit `body`, expect the refusal on `field`, and that no job, hold or money moved."""
    before = (Job.objects.count(), Hold.objects.count(), LedgerTransaction.objects.count())
    response = post(api, body)
    assert response.status_code == 400, response.json()
    problem = response.json()
    assert problem["type"] == "validation-error" and problem["title"] == "The job can never run"
    assert list(problem["errors"]) == [field]
    assert (Job.objects.count(), Hold.objects.count(), LedgerTransaction.objects.count()) == before
    return problem


def test_a_gang_larger_than_any_ib_group_is_refused(api: APIClient, job_body: Callable, t4: GpuType) -> None:
    # The down node counts (it may come back): 16 GPUs fit the group, 17 never can.
    assert post(api, job_body(gpu_types=["T4"], gpu_count=16, gpu_memory_gb=0)).status_code == 201
    problem = refused(api, job_body(gpu_types=["T4"], gpu_count=17, gpu_memory_gb=0), "gpu_count")
    assert problem["detail"] == (
        "No GPU type this job accepts could ever run it (T4: 17 GPUs need T4 nodes of one IB group and "
        "the largest group has 16 GPUs)."
    )


def test_no_node_of_the_type_in_the_jobs_regions_is_refused(
    api: APIClient, job_body: Callable, t4: GpuType
) -> None:
    body = job_body(gpu_types=["T4"], gpu_count=1, gpu_memory_gb=0, regions=["us"])
    problem = refused(api, body, "regions")
    assert problem["errors"]["regions"] == ["T4: there are no T4 nodes in us."]


def test_a_type_without_nodes_is_refused(api: APIClient, job_body: Callable) -> None:
    GpuType.objects.create(name="B200", memory_gb=192)
    GpuPrice.objects.create(gpu_type=GpuType.objects.get(name="B200"), price_per_gpu_hour=9_000_000,
                            effective_from=timezone.now() - timedelta(days=1))
    problem = refused(api, job_body(gpu_types=["B200"], gpu_count=1), "gpu_types")
    assert problem["errors"]["gpu_types"] == ["B200: there are no B200 nodes."]


@pytest.mark.parametrize("level", ["org", "project"])
def test_a_job_larger_than_its_quota_is_refused(
    api: APIClient, job_body: Callable, tenant: Tenant, t4: GpuType, level: str
) -> None:
    Quota.objects.create(org=tenant.org, project=tenant.project if level == "project" else None,
                         gpu_type=t4, max_gpus=4)
    assert post(api, job_body(gpu_types=["T4"], gpu_count=4, gpu_memory_gb=0)).status_code == 201
    who = "organization" if level == "org" else "project"
    problem = refused(api, job_body(gpu_types=["T4"], gpu_count=5, gpu_memory_gb=0), "gpu_count")
    assert problem["errors"]["gpu_count"] == [f"T4: the {who}'s concurrent-GPU quota on T4 is 4."]


def test_one_type_that_could_run_it_is_enough(api: APIClient, job_body: Callable, t4: GpuType) -> None:
    response = post(api, job_body(gpu_types=["T4", "H100"], gpu_count=17, gpu_memory_gb=0))
    assert response.status_code == 201, response.json()


def test_a_node_registered_after_the_catalog_was_cached_is_seen_before_refusing(
    api: APIClient, job_body: Callable, t4: GpuType
) -> None:
    catalog()  # cached now, with the 16-GPU group
    eu = Region.objects.get(code="eu")
    # bulk_create sends no post_save: like a node registered by another process within the TTL.
    Node.objects.bulk_create([Node(name="t4-new", region=eu, gpu_type=t4, gpu_count=8, ib_group="ib-a")])
    response = post(api, job_body(gpu_types=["T4"], gpu_count=24, gpu_memory_gb=0))
    assert response.status_code == 201, response.json()
