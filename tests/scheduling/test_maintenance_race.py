"""A maintenance window set on another connection after a scheduling pass read its snapshot and
before it writes: the writer re-reads the node (as for a cordon) and does not place a job that
would run into the window."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from ledger.services import place_hold
from scheduling import core
from scheduling.models import Job, JobAttempt, JobState, Node
from scheduling.services.tick import run_scheduling_pass
from tests.factories import fund

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_window_set_while_a_pass_decides_keeps_its_job_off_the_node(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = fleet["node"]
    fund(tenant["org"], 10**12)
    hold = place_hold(org=tenant["org"], amount=40_000_000, key="window-race", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    job = make_job(JobState.QUEUED, current_hold=hold, gpu_types=["H100"], gpu_count=1,
                   max_wall_seconds=3 * 3600)

    def plan_maintenance() -> None:  # an operator, on another connection
        try:
            now = timezone.now()
            Node.objects.filter(pk=node.pk).update(maintenance_from=now + timedelta(hours=1),
                                                   maintenance_until=now + timedelta(hours=2))
        finally:
            connection.close()

    decide = core.schedule

    def schedule_then_window(snapshot: core.Snapshot) -> core.Result:
        result = decide(snapshot)
        assert [p.job_id for p in result.placements] == [job.pk]  # decided before the window
        thread = threading.Thread(target=plan_maintenance)
        thread.start()
        thread.join(30)
        return result

    monkeypatch.setattr(core, "schedule", schedule_then_window)
    run_scheduling_pass(trigger="race")
    assert not JobAttempt.objects.exists()
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
