"""Fixtures for metering: a node with a real token, a funded org, running attempts with real holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from accounts.models import Region
from ledger.models import MICRO, Hold
from ledger.services import place_hold
from metering.models import AttemptUsage
from scheduling.models import (
    Allocation,
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
from scheduling.services.nodes import issue_node_token
from tests.factories import ProjectFactory, UserFactory, fund

H100_RATE = 3_600_000  # 3.6 credits per GPU-hour = 1 micro-credit per GPU-millisecond


@dataclass
class World:
    """Everything a metering test needs, created through the real services."""

    region: Region
    h100: GpuType
    node: Node
    token: str
    org: Any
    project: Any
    user: Any


def shift_started(attempt: JobAttempt, seconds: float) -> None:
    """Pretend the attempt started `seconds` ago on the DB clock (tests cannot wait an hour)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE scheduling_jobattempt SET started_at = now() - make_interval(secs => %s) WHERE id = %s",
            [seconds, attempt.pk],
        )
    attempt.refresh_from_db()


def ensure_priority_classes() -> None:
    """Transactional tests flush the data migration's rows; put the defaults back."""
    import importlib

    defaults = importlib.import_module("scheduling.migrations.0002_default_priority_classes").DEFAULTS
    for name, rank, preemptible, can_preempt in defaults:
        PriorityClass.objects.get_or_create(
            name=name, defaults={"rank": rank, "preemptible": preemptible, "can_preempt": can_preempt}
        )


@pytest.fixture
def world(db: Any) -> World:
    ensure_priority_classes()
    region = Region.objects.create(code="eu", name="Europe")
    h100 = GpuType.objects.create(name="H100", memory_gb=80)
    GpuPrice.objects.create(
        gpu_type=h100, price_per_gpu_hour=H100_RATE, effective_from=timezone.now() - timedelta(days=30)
    )
    node = Node.objects.create(
        name="h100-1", region=region, gpu_type=h100, gpu_count=8, state=NodeState.READY
    )
    token = issue_node_token(node=node)
    project = ProjectFactory()
    return World(region, h100, node, token, project.org, project, UserFactory())


@pytest.fixture
def funded(world: World) -> Callable[..., Any]:
    def make(amount: int = 100 * MICRO, **kw: Any) -> Any:
        return fund(world.org, amount, **kw)

    return make


@pytest.fixture
def make_attempt(world: World) -> Callable[..., JobAttempt]:
    """A job with a real hold and one attempt on the node (running, started `started_ago` s ago)."""
    counter = iter(range(1, 100_000))

    def make(
        *,
        hold_amount: int = 10 * MICRO,
        gpus: tuple[int, ...] = (0, 1),
        state: str = AttemptState.RUNNING,
        started_ago: float | None = 3600,
        node: Node | None = None,
        max_wall_seconds: int = 3600,
        hold: Hold | None = None,
    ) -> JobAttempt:
        n = next(counter)
        if hold is None:
            hold = place_hold(
                org=world.org,
                amount=hold_amount,
                key=f"test-job-{n}",
                project=world.project,
                user=world.user,
                gpu_types=["H100"],
                reference=f"job:test-{n}",
            )
        job = Job.objects.create(
            org=world.org,
            project=world.project,
            user=world.user,
            name=f"job-{n}",
            gpu_types=["H100"],
            gpu_count=len(gpus),
            max_wall_seconds=max_wall_seconds,
            priority_class=PriorityClass.objects.get(name="standard"),
            command="sleep 1",
            state=JobState.RUNNING if state != AttemptState.SCHEDULED else JobState.SCHEDULED,
            current_hold=hold,
            estimate=hold.authorized,
            attempt_count=1,
            submitted_at=timezone.now(),
        )
        attempt = JobAttempt.objects.create(
            job=job,
            number=1,
            org_id=world.org.pk,
            state=state,
            gpu_type=world.h100,
            gpu_count=len(gpus),
            rate_per_gpu_hour=H100_RATE,
            hold=hold,
            scheduled_at=timezone.now(),
        )
        now = timezone.now()
        started = now if state != AttemptState.SCHEDULED and started_ago is not None else None
        Allocation.objects.bulk_create(
            [
                Allocation(attempt=attempt, node=node or world.node, gpu_index=i, allocated_at=now,
                           started_at=started)
                for i in gpus
            ]
        )
        if state != AttemptState.SCHEDULED and started_ago is not None:
            AttemptUsage.objects.create(attempt=attempt, org_id=world.org.pk)
            shift_started(attempt, started_ago)
        return attempt

    return make


@pytest.fixture
def submit(world: World) -> Callable[..., Job]:
    """Submit a job through the real submission service (budgets + hold), as the API does."""
    from scheduling.services.submission import JobSpec, submit_job
    from tests.factories import MembershipFactory

    MembershipFactory(project=world.project, user=world.user)
    counter = iter(range(1, 100_000))

    def make(
        *,
        gpus: int = 2,
        max_wall_seconds: int = 3600,
        command: str = "sleep 1",
        priority_class: str = "standard",
    ) -> Job:
        spec = JobSpec(
            name=f"job-{next(counter)}",
            gpu_types=("H100",),
            gpu_count=gpus,
            max_wall_seconds=max_wall_seconds,
            priority_class=priority_class,
            command=command,
        )
        return submit_job(
            user=world.user, project=world.project, spec=spec, idempotency_key=f"k-{next(counter)}"
        )

    return make


def place_pending() -> list[JobAttempt]:
    """One real scheduling pass; returns the attempts it placed."""
    from scheduling.services.tick import run_scheduling_pass

    before = set(JobAttempt.objects.values_list("pk", flat=True))
    run_scheduling_pass(trigger="test")
    return list(JobAttempt.objects.exclude(pk__in=before).order_by("pk"))


def mark_node_alive(node: Node) -> None:
    Node.objects.filter(pk=node.pk).update(state=NodeState.READY, last_heartbeat_at=timezone.now())
