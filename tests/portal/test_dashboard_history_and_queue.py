"""The dashboard's last-hour GPU chart (from allocation history) and its queue-by-reason table."""

from __future__ import annotations

from datetime import timedelta

import pytest

from config.clock import db_now
from portal.access import dashboard_scope
from portal.dashboard import build_snapshot, for_scope
from portal.selectors import gpus_in_use_series
from scheduling.models import Allocation, AttemptState, Job, JobAttempt, JobState, Node
from tests.portal.conftest import World

pytestmark = pytest.mark.django_db


def _ended_attempt(world: World, *, start_min_ago: int, end_min_ago: int, gpus: int) -> None:
    """An attempt of the world's job that held `gpus` GPUs from `start_min_ago` to `end_min_ago`."""
    now = db_now()
    started, ended = now - timedelta(minutes=start_min_ago), now - timedelta(minutes=end_min_ago)
    attempt = JobAttempt.objects.create(
        job=world.job, number=JobAttempt.objects.filter(job=world.job).count() + 1,
        org_id=world.acme.id, state=AttemptState.ENDED, gpu_type=world.h100, gpu_count=gpus,
        rate_per_gpu_hour=1, hold=world.hold, scheduled_at=started, started_at=started, ended_at=ended,
    )
    node = Node.objects.get(name="node-a1")
    for index in range(2, 2 + gpus):  # the world's live job holds GPUs 0 and 1
        Allocation.objects.create(attempt=attempt, node=node, gpu_index=index, allocated_at=started,
                                  released_at=ended)


def test_gpus_in_use_series_reads_the_allocation_history(world: World) -> None:
    _ended_attempt(world, start_min_ago=52, end_min_ago=22, gpus=3)  # live at -50 .. -25
    _ended_attempt(world, start_min_ago=90, end_min_ago=70, gpus=4)  # before the window
    _ended_attempt(world, start_min_ago=14, end_min_ago=6, gpus=1)  # live at -10 only
    series = gpus_in_use_series()
    # 13 instants, -60 min ... now; the world's running job (2 GPUs) was allocated just now.
    assert series == [0, 0, 3, 3, 3, 3, 3, 3, 0, 0, 1, 0, 2]


def test_the_last_point_is_what_the_gpu_table_counts(world: World) -> None:
    snapshot = build_snapshot()
    assert snapshot["gpus_in_use_last_hour"][-1] == sum(t["allocated"] for t in snapshot["gpu_types"]) == 2


def _queued(world: World, org: object, project: object, reason: str, *, gpus: int, hours_ago: float) -> Job:
    return Job.objects.create(
        org=org, project=project, user=world.alice, name=f"wait-{reason or 'new'}", gpu_types=["H100"],
        gpu_count=gpus, max_wall_seconds=3600, priority_class=world.job.priority_class,
        state=JobState.QUEUED, wait_reason=reason, submitted_at=db_now() - timedelta(hours=hours_ago),
    )


def test_queue_groups_waiting_jobs_by_reason_per_viewer(world: World) -> None:
    globex_project = world.globex.projects.create(name="Lab", slug="lab")
    _queued(world, world.acme, world.vision, "resources", gpus=8, hours_ago=3)
    _queued(world, world.acme, world.vision, "resources", gpus=4, hours_ago=1)
    _queued(world, world.acme, world.vision, "reserved-for-job-5", gpus=1, hours_ago=0.5)
    _queued(world, world.acme, world.vision, "reserved-for-job-9", gpus=2, hours_ago=2)
    _queued(world, world.acme, world.vision, "", gpus=1, hours_ago=0)
    _queued(world, world.globex, globex_project, "resources", gpus=16, hours_ago=5)
    _queued(world, world.globex, globex_project, "quota", gpus=2, hours_ago=0.25)
    snapshot = build_snapshot()

    finance = for_scope(snapshot, dashboard_scope(world.carol))["queue"]
    rows = {row["reason"]: row for row in finance}
    assert [row["reason"] for row in finance] == ["resources", "reserved-for-job-N", "new", "quota"]
    assert (rows["resources"]["jobs"], rows["resources"]["gpus"]) == (3, 28)
    assert 5 * 3600 - 60 <= rows["resources"]["longest_wait_seconds"] <= 5 * 3600 + 60
    assert (rows["reserved-for-job-N"]["jobs"], rows["reserved-for-job-N"]["gpus"]) == (2, 3)
    assert 2 * 3600 - 60 <= rows["reserved-for-job-N"]["longest_wait_seconds"] <= 2 * 3600 + 60

    owner = for_scope(snapshot, dashboard_scope(world.bob))["queue"]  # globex's owner only
    assert [(row["reason"], row["jobs"], row["gpus"]) for row in owner] == [
        ("quota", 1, 2), ("resources", 1, 16),
    ]
    assert 5 * 3600 - 60 <= owner[1]["longest_wait_seconds"] <= 5 * 3600 + 60
    # The per-org rows stay on the server.
    assert "queue_rows" not in for_scope(snapshot, dashboard_scope(world.bob))


def test_a_requeued_or_released_job_has_waited_only_while_it_was_queued(world: World) -> None:
    """The longest wait counted the run of a preempted job's earlier attempt, and the time a
    job was held by its user, as waiting."""
    preempted = _queued(world, world.acme, world.vision, "resources", gpus=1, hours_ago=5)
    now = db_now()
    JobAttempt.objects.create(  # ran 3 of its 5 hours
        job=preempted, number=1, org_id=world.acme.id, state=AttemptState.ENDED, gpu_type=world.h100,
        gpu_count=1, rate_per_gpu_hour=1, hold=world.hold, scheduled_at=now - timedelta(hours=4),
        started_at=now - timedelta(hours=4), ended_at=now - timedelta(hours=1),
    )
    released = _queued(world, world.acme, world.vision, "priority", gpus=1, hours_ago=6)
    Job.objects.filter(pk=released.pk).update(aging_from=now - timedelta(hours=1.5))
    rows = {row["reason"]: row for row in for_scope(build_snapshot(), dashboard_scope(world.carol))["queue"]}
    assert 2 * 3600 - 60 <= rows["resources"]["longest_wait_seconds"] <= 2 * 3600 + 60
    assert 1.5 * 3600 - 60 <= rows["priority"]["longest_wait_seconds"] <= 1.5 * 3600 + 60


def test_running_and_finished_jobs_are_not_in_the_queue(world: World) -> None:
    _queued(world, world.acme, world.vision, "resources", gpus=1, hours_ago=1)
    Job.objects.filter(name="wait-resources").update(state=JobState.CANCELLED)
    assert for_scope(build_snapshot(), dashboard_scope(world.carol))["queue"] == []


def test_a_node_inside_its_maintenance_window_shows_it(world: World) -> None:
    now = db_now()
    Node.objects.filter(name="node-a1").update(maintenance_from=now - timedelta(minutes=5),
                                               maintenance_until=now + timedelta(hours=1))
    Node.objects.exclude(name="node-a1").update(maintenance_from=now + timedelta(hours=1),
                                                maintenance_until=now + timedelta(hours=2))
    states = {n["name"]: n["state"] for n in build_snapshot()["nodes"]}
    assert states["node-a1"] == "maintenance"
    assert all(state != "maintenance" for name, state in states.items() if name != "node-a1")  # not yet
