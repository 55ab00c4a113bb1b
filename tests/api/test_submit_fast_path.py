"""The submission's hand-written rendering and shared-serializer validation equal DRF's own."""

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rest_framework import serializers
from rest_framework.test import APIClient

from config.api.serializers import validated
from ledger.models import Hold
from scheduling.api.serializers import (
    HoldSummarySerializer,
    JobDetailSerializer,
    JobSubmitSerializer,
    render_hold_summary,
    render_new_job,
)
from scheduling.api.views import _JOB_SUBMIT, get_visible_job
from scheduling.models import Job
from tests.api.factories import Tenant

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("overrides", [
    {}, {"gpu_types": ["L4"], "gpu_memory_gb": 0, "command": "python train.py --lr 1e-3 ✓"},
    {"priority_class": "production", "preemptible": False, "name": "é" * 200},
])
def test_response_equals_the_serializers(api: APIClient, job_body: Callable, tenant: Tenant,
                                         overrides: dict) -> None:
    response = api.post("/api/v1/jobs", job_body(**overrides), format="json",
                        HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
    assert response.status_code == 201, response.json()
    job = get_visible_job(tenant.user, response.json()["id"])
    expected = JobDetailSerializer(Job.objects.prefetch_related("attempts").get(pk=job.pk)).data
    assert response.json() == expected
    assert list(render_new_job(job)) == list(expected)  # same keys, same order
    assert render_hold_summary(job.current_hold) == HoldSummarySerializer(job.current_hold).data
    rendered = {**render_new_job(job), "hold": render_hold_summary(job.current_hold)}
    assert rendered == expected
    settled = Hold(pk=1, state="settled", authorized=5, captured=2, released=3,
                   created_at=job.submitted_at, settled_at=job.submitted_at)
    assert render_hold_summary(settled) == HoldSummarySerializer(settled).data


BODIES: list[Any] = [
    None, [], "x", 7, {}, {"colour": "blue"},
    {"project": "1", "name": 5, "gpu_types": "H100", "gpu_count": 1.5, "max_wall_seconds": True,
     "priority_class": None},
    {"project": 1, "name": "", "gpu_types": [], "gpu_count": 0, "max_wall_seconds": 0,
     "priority_class": "x" * 40, "preemptible": "no", "regions": ["a"] * 17, "command": "\x00"},
    {"project": 2**60, "name": "n", "gpu_types": ["H100", 3, ""], "gpu_count": 2000,
     "max_wall_seconds": 10**9, "priority_class": "batch", "gpu_memory_gb": -1},
    {"project": 1, "name": "ok", "gpu_types": ["H100"], "gpu_count": 1, "max_wall_seconds": 60,
     "priority_class": "batch"},
]


@pytest.mark.parametrize("body", BODIES)
def test_shared_validation_equals_is_valid(body: Any) -> None:
    fresh = JobSubmitSerializer(data=body)
    if fresh.is_valid():
        assert validated(_JOB_SUBMIT, body) == fresh.validated_data
        return
    with pytest.raises(serializers.ValidationError) as error:
        validated(_JOB_SUBMIT, body)
    assert error.value.detail == serializers.ValidationError(fresh.errors).detail
    assert error.value.get_codes() == serializers.ValidationError(fresh.errors).get_codes()


@pytest.mark.parametrize("overrides", [{}, {"preemptible": False, "command": "", "regions": ["eu"]}])
def test_job_insert_writes_what_save_writes(tenant: Tenant, fleet: Any, overrides: dict) -> None:
    """`submission._insert` (prepared, plain values passed as they are) stores the same row as
    `save(force_insert=True)`."""
    from django.utils import timezone

    from scheduling.models import PriorityClass
    from scheduling.services.submission import _insert

    cls = PriorityClass.objects.get(name="standard")
    fields: dict[str, Any] = {
        "org_id": tenant.org.pk, "project": tenant.project, "user": tenant.user, "name": "n",
        "gpu_types": ["H100", "A100"], "gpu_count": 2, "gpu_memory_gb": 40,
        "max_wall_seconds": 3600, "priority_class_id": cls.pk, "preemptible": True,
        "command": "run ✓", "regions": [], "state": "queued", "submitted_at": timezone.now(),
        "estimate": 2**40, **overrides,
    }
    fast, orm = Job(**fields), Job(**fields)
    _insert(fast)
    orm.save(force_insert=True)
    rows = {row.pop("id"): row for row in Job.objects.filter(pk__in=[fast.pk, orm.pk]).values()}
    for row in rows.values():
        row.pop("updated_at")
    assert rows[fast.pk] == rows[orm.pk]
    assert fast.updated_at is not None and not fast._state.adding
