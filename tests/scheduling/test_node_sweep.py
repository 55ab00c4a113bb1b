"""Silent nodes go unknown, then down; the attempts on a down node end as lost and are requeued."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from config.clock import db_now
from ledger.services import place_hold
from scheduling.models import Allocation, AttemptState, Job, JobAttempt, JobState, Node, NodeState
from scheduling.services.tick import sweep_nodes
from tests.factories import fund

pytestmark = pytest.mark.django_db


def test_silent_node_goes_unknown_then_down_and_its_attempts_are_requeued(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt], settings: Any,
) -> None:
    settings.METERING_NODE_UNKNOWN_AFTER_S = 60
    settings.METERING_NODE_DOWN_AFTER_S = 300
    fund(tenant["org"], 100_000_000)
    hold = place_hold(org=tenant["org"], amount=3_000_000, key="sweep", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    job = make_job(JobState.RUNNING, current_hold=hold, gpu_types=["H100"], gpu_count=1)
    attempt = make_attempt(job, AttemptState.RUNNING, gpu_count=1)
    Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=0,
                              allocated_at=attempt.scheduled_at)
    node = fleet["node"]

    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=db_now() - timedelta(seconds=120))
    assert sweep_nodes() == {"unknown": 1, "down": 0, "lost": 0, "withdrawn": 0, "evicted": 0, "overdue": 0}
    assert Node.objects.get(pk=node.pk).state == NodeState.UNKNOWN

    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=db_now() - timedelta(seconds=600))
    assert sweep_nodes() == {"unknown": 0, "down": 1, "lost": 1, "withdrawn": 0, "evicted": 0, "overdue": 0}
    assert Node.objects.get(pk=node.pk).state == NodeState.DOWN
    attempt.refresh_from_db()
    assert (attempt.state, attempt.outcome) == (AttemptState.ENDED, "lost")
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    idle = {"unknown": 0, "down": 0, "lost": 0, "withdrawn": 0, "evicted": 0, "overdue": 0}
    assert sweep_nodes() == idle  # idempotent


def test_an_attempt_running_past_its_max_wall_is_stopped_by_the_server(
    fleet: dict[str, Any], make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt],
) -> None:
    """QA: with the agent not enforcing max wall, nothing on the server did while the node answered."""
    job = make_job(JobState.RUNNING, gpu_count=1, max_wall_seconds=60)
    started = db_now() - timedelta(seconds=60 + 30 + 59)  # wall + stop grace + just under the slack
    attempt = make_attempt(job, AttemptState.RUNNING, gpu_count=1, started_at=started)
    Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=0, allocated_at=started)
    assert sweep_nodes()["overdue"] == 0
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=started - timedelta(seconds=2))
    assert sweep_nodes()["overdue"] == 1
    attempt.refresh_from_db()
    assert (attempt.state, attempt.stop_reason, attempt.grace_seconds) == (
        AttemptState.STOPPING, "timed_out", 30,
    )
    assert sweep_nodes()["overdue"] == 0  # asked once
