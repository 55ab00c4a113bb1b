"""Fixtures for the scheduling DB tests: a small fleet, a funded org, and jobs in any state.

Holds are written as bare rows here (no journal) where a test only needs a hold to point at;
tests of money movement go through the ledger services instead.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import Region
from config.clock import db_now
from ledger.models import Hold
from scheduling.models import (
    AttemptState,
    GpuPrice,
    GpuType,
    Job,
    JobAttempt,
    JobState,
    Node,
    NodeState,
    PriorityClass,
)
from tests.factories import ProjectFactory, UserFactory

H100_PRICE = 3_000_000
A100_PRICE = 1_800_000


CLASSES = {  # as migration 0002 seeds them (transactional tests flush migration data)
    "production": (500, False, True),
    "premium": (400, True, True),
    "standard": (300, True, True),
    "batch": (200, True, False),
    "interactive": (100, True, False),
}


def priority(name: str) -> PriorityClass:
    rank, preemptible, can_preempt = CLASSES[name]
    klass, _ = PriorityClass.objects.get_or_create(
        name=name, defaults={"rank": rank, "preemptible": preemptible, "can_preempt": can_preempt}
    )
    return klass


@pytest.fixture
def fleet(db: Any) -> dict[str, Any]:
    for name in CLASSES:
        priority(name)
    region = Region.objects.create(code="eu", name="Europe")
    h100 = GpuType.objects.create(name="H100", memory_gb=80)
    a100 = GpuType.objects.create(name="A100", memory_gb=80)
    past = timezone.now() - timedelta(days=30)
    GpuPrice.objects.create(gpu_type=h100, price_per_gpu_hour=H100_PRICE, effective_from=past)
    GpuPrice.objects.create(gpu_type=a100, price_per_gpu_hour=A100_PRICE, effective_from=past)
    node = Node.objects.create(
        name="h100-1", region=region, gpu_type=h100, gpu_count=8, state=NodeState.READY,
        last_heartbeat_at=timezone.now(), ib_group="ib1",
    )
    return {"region": region, "h100": h100, "a100": a100, "node": node}


@pytest.fixture
def tenant(db: Any) -> dict[str, Any]:
    """An org granted the restricted `production` class (its queued jobs of it are offered)."""
    from tests.api.factories import grant

    project = ProjectFactory()
    user = UserFactory()
    grant(project.org)
    return {"org": project.org, "project": project, "user": user}


@pytest.fixture
def make_hold(tenant: dict[str, Any]) -> Callable[..., Hold]:
    counter = iter(range(1, 10_000))

    def make(amount: int = 10_000_000, **kw: Any) -> Hold:
        return Hold.objects.create(
            org=tenant["org"], project=tenant["project"], user=tenant["user"],
            key=f"test-hold-{next(counter)}", authorized=amount, created_at=timezone.now(), **kw,
        )

    return make


@pytest.fixture
def make_job(tenant: dict[str, Any], make_hold: Callable[..., Hold]) -> Callable[..., Job]:
    def make(state: str = JobState.QUEUED, *, hold: bool = True, hold_amount: int | None = None,
             **kw: Any) -> Job:
        fields: dict[str, Any] = {
            "org": tenant["org"], "project": tenant["project"], "user": tenant["user"],
            "name": "train", "gpu_types": ["H100", "A100"], "gpu_count": 2,
            "max_wall_seconds": 3600, "submitted_at": timezone.now(),
            "priority_class": priority("standard"),
            "command": "python train.py",
        }
        fields.update(kw)
        if hold and "current_hold" not in fields:
            fields["current_hold"] = make_hold() if hold_amount is None else make_hold(hold_amount)
            fields["estimate"] = fields["current_hold"].authorized
        return Job.objects.create(state=state, **fields)

    return make


@pytest.fixture
def make_attempt(fleet: dict[str, Any]) -> Callable[..., JobAttempt]:
    def make(job: Job, state: str = AttemptState.SCHEDULED, **kw: Any) -> JobAttempt:
        job.attempt_count += 1
        Job.objects.filter(pk=job.pk).update(attempt_count=job.attempt_count)
        fields: dict[str, Any] = {
            "job": job, "number": job.attempt_count, "org_id": job.org_id, "state": state,
            "gpu_type": fleet["h100"], "gpu_count": job.gpu_count,
            "rate_per_gpu_hour": H100_PRICE, "hold": job.current_hold,
            "scheduled_at": db_now(),  # the DB clock, as the writer uses (stable in a test transaction)
        }
        fields.update(kw)
        return JobAttempt.objects.create(**fields)

    return make
