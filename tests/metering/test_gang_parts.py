"""A gang on several nodes (one attempt, parts on nodes of one IB group) is started on every node,
billed for all its GPUs, and ends when its last part does (review: billed for one node's GPUs,
its second node never told to start, its first part's exit released every node's GPUs)."""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.test import Client

from audit.models import AuditEvent
from ledger.models import HoldState
from metering.models import AttemptUsage
from scheduling.models import Allocation, AttemptState, JobAttempt, Node, NodeState
from scheduling.services.nodes import issue_node_token
from tests.metering.conftest import World, mark_node_alive, place_pending, shift_started

PREFIX = "/api/v1/agent"
PER_NODE_MS = 4 * 600_000  # each node's 4 GPUs for 600 s


def agent(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def post(client: Client, path: str, body: Any) -> Any:
    return client.post(f"{PREFIX}{path}", body, content_type="application/json")


@pytest.fixture
def gang(world: World, funded: Any, submit: Any) -> tuple[JobAttempt, list[Client], list[Node]]:
    """An 8-GPU job placed on two 4-GPU H100 nodes of one IB group (nothing else can hold it)."""
    funded()
    Node.objects.filter(pk=world.node.pk).update(gpu_count=4, ib_group="ib-1")
    world.node.refresh_from_db()
    other = Node.objects.create(name="h100-2", region=world.region, gpu_type=world.h100, gpu_count=4,
                                state=NodeState.READY, ib_group="ib-1")
    tokens = {world.node.pk: world.token, other.pk: issue_node_token(node=other)}
    mark_node_alive(world.node)
    mark_node_alive(other)
    submit(gpus=8, max_wall_seconds=3600)
    [attempt] = place_pending()
    nodes = sorted({a.node for a in attempt.allocations.all()}, key=lambda n: n.pk)
    assert [n.pk for n in nodes] == sorted(tokens), "the scheduler placed the gang across both nodes"
    return attempt, [agent(tokens[n.pk]) for n in nodes], nodes


def _start_both(attempt: JobAttempt, agents: list[Client]) -> None:
    for client in agents:
        assert post(client, f"/attempts/{attempt.pk}/started", {}).status_code == 200
    shift_started(attempt, 600)


def test_every_node_of_a_gang_is_told_to_start_its_part_with_its_peers(gang: Any) -> None:
    attempt, (first, second), _nodes = gang
    start = first.get(f"{PREFIX}/assignments").json()["start"]
    assert [s["attempt_id"] for s in start] == [attempt.pk] and len(start[0]["gpu_indices"]) == 4
    assert start[0]["env"] | {"GPUBANK_ATTEMPT_NUMBER": "1"} == {
        "GPUBANK_ATTEMPT_NUMBER": "1", "GPUBANK_NODES": "h100-1,h100-2", "GPUBANK_NUM_NODES": "2",
        "GPUBANK_NODE_RANK": "0"}
    assert post(first, f"/attempts/{attempt.pk}/started", {}).status_code == 200
    # The attempt is running, and the second node still gets its half (it never did).
    start = second.get(f"{PREFIX}/assignments").json()["start"]
    assert [s["attempt_id"] for s in start] == [attempt.pk]
    assert start[0]["env"]["GPUBANK_NODE_RANK"] == "1"
    assert first.get(f"{PREFIX}/assignments").json()["start"] == []  # started here: not again
    # A restarted agent of the second node is not told its unstarted half runs (it would report
    # it lost); once started there, it is.
    gpus = [{"index": i, "model": "H100", "memory_gb": 80, "uuid": f"b{i}"} for i in range(4)]
    assert post(second, "/register", {"gpus": gpus}).json()["running_attempts"] == []
    assert post(second, f"/attempts/{attempt.pk}/started", {}).status_code == 200
    assert second.get(f"{PREFIX}/assignments").json()["start"] == []
    assert post(second, "/register", {"gpus": gpus}).json()["running_attempts"] == [attempt.pk]


def test_a_gang_is_billed_for_all_its_gpus(gang: Any) -> None:
    attempt, agents, _nodes = gang
    _start_both(attempt, agents)
    for client in agents:  # each agent reports its own 4 GPUs, as the protocol defines it
        body = {"attempts": [{"attempt_id": attempt.pk, "seq": 1, "cumulative_gpu_ms": PER_NODE_MS}]}
        assert post(client, "/heartbeats", body).json()["accepted"] == 1
    assert AttemptUsage.objects.get(attempt=attempt).billable_gpu_ms == 2 * PER_NODE_MS


def test_a_gang_ends_when_its_last_part_exits_and_settles_on_all_its_gpus(gang: Any) -> None:
    attempt, (first, second), nodes = gang
    _start_both(attempt, [first, second])
    done = {"seq": 1, "cumulative_gpu_ms": PER_NODE_MS, "exit_code": 0, "signal": None,
            "outcome": "completed"}
    answer = post(first, f"/attempts/{attempt.pk}/exit", done).json()
    assert (answer["duplicate"], answer["outcome"]) == (False, "completed")
    attempt.refresh_from_db()
    # Still running on the second node: its GPUs stay allocated, the first node's are free; the
    # second part is asked to stop with the timeout grace.
    assert attempt.state == AttemptState.STOPPING and attempt.stop_reason == ""
    live = Allocation.objects.filter(attempt=attempt, released_at__isnull=True)
    assert set(live.values_list("node_id", flat=True)) == {nodes[1].pk}
    beat = {"attempts": [{"attempt_id": attempt.pk, "seq": 1, "cumulative_gpu_ms": PER_NODE_MS}]}
    stops = post(second, "/heartbeats", beat).json()["stop"]
    assert [s["attempt_id"] for s in stops] == [attempt.pk] and stops[0]["grace_seconds"] > 0
    assert post(first, f"/attempts/{attempt.pk}/exit", done).json()["duplicate"] is True  # a repeat
    parts = AuditEvent.objects.filter(action="sched.attempt.part_ended", subject_id=str(attempt.pk))
    assert parts.count() == 1

    # The second part, stopped, reports `cancelled`: the first part's outcome decides.
    stopped = {"seq": 2, "cumulative_gpu_ms": PER_NODE_MS, "exit_code": None, "signal": 15,
               "outcome": "cancelled"}
    assert post(second, f"/attempts/{attempt.pk}/exit", stopped).json()["duplicate"] is False
    attempt.refresh_from_db()
    assert (attempt.state, attempt.outcome, attempt.exit_code) == (AttemptState.ENDED, "completed", 0)
    assert attempt.job.state == "completed"
    hold = attempt.hold
    hold.refresh_from_db()
    assert hold.state == HoldState.SETTLED
    assert hold.captured == 2 * PER_NODE_MS  # 1 micro-credit per GPU-ms: 8 GPUs x 600 s


def test_a_gang_whose_first_part_fails_fails(gang: Any) -> None:
    attempt, (first, second), _nodes = gang
    _start_both(attempt, [first, second])
    failed = {"seq": 1, "cumulative_gpu_ms": PER_NODE_MS, "exit_code": 3, "signal": None, "outcome": "failed"}
    post(second, f"/attempts/{attempt.pk}/exit", failed)
    stopped = {"seq": 1, "cumulative_gpu_ms": PER_NODE_MS, "exit_code": None, "signal": 15,
               "outcome": "cancelled"}
    post(first, f"/attempts/{attempt.pk}/exit", stopped)
    attempt.refresh_from_db()
    assert (attempt.outcome, attempt.exit_code, attempt.job.state) == ("failed", 3, "failed")


def test_a_gang_whose_second_node_never_started_ends_with_its_first_part(gang: Any) -> None:
    attempt, (first, second), _nodes = gang
    assert post(first, f"/attempts/{attempt.pk}/started", {}).status_code == 200
    shift_started(attempt, 60)
    launch = {"seq": 0, "cumulative_gpu_ms": 0, "exit_code": 127, "signal": None, "outcome": "launch_failed"}
    post(first, f"/attempts/{attempt.pk}/exit", launch)
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.ENDED and attempt.outcome == "launch_failed"
    assert not Allocation.objects.filter(attempt=attempt, released_at__isnull=True).exists()
    assert second.get(f"{PREFIX}/assignments").json()["start"] == []
    assert post(second, f"/attempts/{attempt.pk}/started", {}).status_code == 409


def test_a_lost_node_of_a_gang_stops_the_live_part_which_keeps_its_gpus_until_it_exits(
    gang: Any, submit: Any
) -> None:
    """Review: a node loss ended the gang at once, releasing the live node's GPUs to the next job
    while its part still ran there."""
    from scheduling.services.tick import sweep_nodes
    from tests.metering.conftest import place_pending

    attempt, (first, second), nodes = gang
    _start_both(attempt, [first, second])
    beat = {"attempts": [{"attempt_id": attempt.pk, "seq": 1, "cumulative_gpu_ms": PER_NODE_MS}]}
    assert post(second, "/heartbeats", beat).json()["accepted"] == 1
    Node.objects.filter(pk=nodes[0].pk).update(state=NodeState.DOWN)
    sweep_nodes()
    attempt.refresh_from_db()
    assert (attempt.state, attempt.first_part_outcome) == (AttemptState.STOPPING, "lost")
    live = Allocation.objects.filter(attempt=attempt, released_at__isnull=True)
    assert set(live.values_list("node_id", flat=True)) == {nodes[1].pk}
    submit(gpus=4, max_wall_seconds=600)
    assert place_pending() == []  # node B's GPUs are still the gang's
    beat["attempts"][0]["seq"] = 2
    assert [s["attempt_id"] for s in post(second, "/heartbeats", beat).json()["stop"]] == [attempt.pk]
    stopped = {"seq": 3, "cumulative_gpu_ms": PER_NODE_MS, "exit_code": None, "signal": 15,
               "outcome": "cancelled"}
    post(second, f"/attempts/{attempt.pk}/exit", stopped)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.outcome, attempt.job.state) == (AttemptState.ENDED, "lost", "queued")
    assert not Allocation.objects.filter(attempt=attempt, released_at__isnull=True).exists()


def test_a_part_its_own_node_no_longer_reports_is_ended_while_the_other_part_reports(gang: Any) -> None:
    """Review: the left-out sweep read one usage row per attempt, kept fresh by the part still
    reporting, so a part its node had dropped held its GPUs (billed, x2) until the other part ended."""
    from django.db import connection

    from scheduling.services.tick import sweep_nodes

    attempt, (first, second), nodes = gang
    _start_both(attempt, [first, second])
    beat = {"attempts": [{"attempt_id": attempt.pk, "seq": 1, "cumulative_gpu_ms": PER_NODE_MS}]}
    for client in (first, second):
        assert post(client, "/heartbeats", beat).json()["accepted"] == 1
    usage = AttemptUsage.objects.get(attempt=attempt)
    assert set(usage.part_reports) == {str(nodes[0].pk), str(nodes[1].pk)}
    with connection.cursor() as cursor:  # node B last reported its part 10 minutes ago
        cursor.execute("UPDATE metering_attemptusage SET part_reports = jsonb_set(part_reports, %s, "
                       "to_jsonb(now() - interval '10 minutes')) WHERE attempt_id = %s",
                       [[str(nodes[1].pk)], attempt.pk])
        cursor.execute("UPDATE scheduling_allocation SET allocated_at = now() - interval '1 hour', "
                       "started_at = now() - interval '1 hour' WHERE attempt_id = %s", [attempt.pk])
    beat["attempts"][0]["seq"] = 2
    assert post(first, "/heartbeats", beat).json()["accepted"] == 1  # part A reports now
    assert post(second, "/heartbeats", {"attempts": []}).status_code == 200  # B: alive, without it
    sweep_nodes()
    attempt.refresh_from_db()
    assert (attempt.state, attempt.first_part_outcome) == (AttemptState.STOPPING, "lost")
    live = Allocation.objects.filter(attempt=attempt, released_at__isnull=True)
    assert set(live.values_list("node_id", flat=True)) == {nodes[0].pk}  # B's GPUs are free
    stopped = {"seq": 3, "cumulative_gpu_ms": PER_NODE_MS, "exit_code": None, "signal": 15,
               "outcome": "cancelled"}
    post(first, f"/attempts/{attempt.pk}/exit", stopped)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.outcome, attempt.job.state) == (AttemptState.ENDED, "lost", "queued")


def test_a_gang_reported_by_both_nodes_before_the_migration_is_not_ended_lost(gang: Any) -> None:
    """Review: a usage row with no part reports (written before them: a gang running at deploy, or
    a heartbeat served by a web worker not yet upgraded) is judged as a whole; judged by the
    parts' start it was ended `lost` on every node once it had run 5 minutes."""
    from django.db import connection

    from scheduling.services.tick import sweep_nodes

    attempt, (first, second), _nodes = gang
    _start_both(attempt, [first, second])
    with connection.cursor() as cursor:
        cursor.execute("UPDATE scheduling_allocation SET allocated_at = now() - interval '1 hour', "
                       "started_at = now() - interval '1 hour' WHERE attempt_id = %s", [attempt.pk])
    beat = {"attempts": [{"attempt_id": attempt.pk, "seq": 1, "cumulative_gpu_ms": PER_NODE_MS}]}
    for client in (first, second):  # both nodes report the gang, now
        assert post(client, "/heartbeats", beat).json()["accepted"] == 1
    with connection.cursor() as cursor:  # as the code before fd090de left the row (or the migration)
        cursor.execute("UPDATE metering_attemptusage SET part_reports = NULL, last_heartbeat_at = now() "
                       "WHERE attempt_id = %s", [attempt.pk])
    sweep_nodes()
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING, (
        f"a gang both nodes reported just now was ended: state {attempt.state}, outcome {attempt.outcome}, "
        f"first part {attempt.first_part_outcome}")


def test_seeded_part_of_a_gang_not_started_at_deploy_is_not_left_out_when_it_starts(gang: Any) -> None:
    """Review: metering/0004 seeded every live allocation's node with the usage row's last report,
    a part not started yet too; when it started, that stale entry was preferred to its start, and
    the sweep ended the gang `lost` before the part's first heartbeat."""
    from scheduling.services.tick import _left_out

    seed = importlib.import_module("metering.migrations.0004_usage_part_reports").seed_part_reports
    attempt, (first, second), _nodes = gang
    assert post(first, f"/attempts/{attempt.pk}/started", {}).status_code == 200
    beat = {"attempts": [{"attempt_id": attempt.pk, "seq": 1, "cumulative_gpu_ms": 1000}]}
    assert post(first, "/heartbeats", beat).json()["accepted"] == 1
    with connection.cursor() as cursor:  # a row from before 0004: no part reports, last report 10 min ago
        cursor.execute("UPDATE metering_attemptusage SET part_reports = NULL, last_heartbeat_at = "
                       "now() - interval '10 minutes' WHERE attempt_id = %s", [attempt.pk])
        cursor.execute("UPDATE scheduling_jobattempt SET started_at = now() - interval '15 minutes' "
                       "WHERE id = %s", [attempt.pk])
        cursor.execute("UPDATE scheduling_allocation SET started_at = now() - interval '15 minutes' "
                       "WHERE attempt_id = %s AND started_at IS NOT NULL", [attempt.pk])
    seed(django_apps, None)  # the migration, at deploy
    # Part B starts now; its node is alive; part A reports.
    assert post(second, f"/attempts/{attempt.pk}/started", {}).status_code == 200
    beat["attempts"][0]["seq"] = 2
    assert post(first, "/heartbeats", beat).json()["accepted"] == 1
    assert post(second, "/heartbeats", {"attempts": []}).status_code == 200
    assert _left_out(timedelta(minutes=5)) == []


@pytest.mark.parametrize("stale_b", [True, False])
@pytest.mark.parametrize("reports", ["none", "both", "a_only"])
def test_portable_left_out_matches_the_sql(gang: Any, stale_b: bool, reports: str) -> None:
    """The SQLite rule (`_left_out_portable`, review: the sweep raised there) is plain ORM: run on
    PostgreSQL beside the SQL, it finds the same parts."""
    from scheduling.services.tick import _left_out, _left_out_portable

    attempt, (first, second), nodes = gang
    for client in (first, second):
        assert post(client, f"/attempts/{attempt.pk}/started", {}).status_code == 200
    beat = {"attempts": [{"attempt_id": attempt.pk, "seq": 1, "cumulative_gpu_ms": 1000}]}
    for client in {"none": (), "both": (first, second), "a_only": (first,)}[reports]:
        assert post(client, "/heartbeats", beat).json()["accepted"] == 1
    with connection.cursor() as cursor:
        cursor.execute("UPDATE scheduling_allocation SET started_at = now() - interval '1 hour' "
                       "WHERE attempt_id = %s", [attempt.pk])
        cursor.execute("UPDATE scheduling_jobattempt SET started_at = now() - interval '1 hour' "
                       "WHERE id = %s", [attempt.pk])
        if stale_b and reports == "both":
            cursor.execute("UPDATE metering_attemptusage SET part_reports = jsonb_set(part_reports, %s, "
                           "to_jsonb(now() - interval '10 minutes')) WHERE attempt_id = %s",
                           [[str(nodes[1].pk)], attempt.pk])
        if reports == "none" and stale_b:
            cursor.execute("UPDATE metering_attemptusage SET last_heartbeat_at = "
                           "now() - interval '10 minutes' WHERE attempt_id = %s", [attempt.pk])
    post(second, "/heartbeats", {"attempts": []})
    post(first, "/heartbeats", {"attempts": []})
    for after in (timedelta(minutes=5), timedelta(minutes=20), timedelta(0)):
        assert _left_out(after) == _left_out_portable(after, attempt_id=None, limit=200)
        assert _left_out(after, limit=1) == _left_out_portable(after, attempt_id=None, limit=1)


def _first_part_ended_seconds_ago(attempt: JobAttempt, node: Node, seconds: float) -> None:
    """As if the first part had exited `seconds` ago: its GPUs' release and the gang's base."""
    earlier = timedelta(seconds=seconds)
    for alloc in Allocation.objects.filter(attempt=attempt, node=node):
        Allocation.objects.filter(pk=alloc.pk).update(
            allocated_at=alloc.allocated_at - earlier, started_at=alloc.started_at - earlier,
            released_at=alloc.released_at - earlier)
    usage = AttemptUsage.objects.get(attempt=attempt)
    AttemptUsage.objects.filter(pk=usage.pk).update(gang_base_at=usage.gang_base_at - earlier)


def test_a_part_still_running_after_the_first_exits_is_billed_for_those_seconds(gang: Any) -> None:
    """Review: after the first part exited, the other part's reports (scaled to its own GPUs now)
    stayed below the gang's figure, so its last seconds (its stop's grace, say) went unbilled. They
    are billed at settlement by the server's clock: its 4 GPUs for the 20 s it ran on."""
    attempt, (first, second), nodes = gang
    _start_both(attempt, [first, second])
    done = {"seq": 1, "cumulative_gpu_ms": PER_NODE_MS, "exit_code": 0, "signal": None,
            "outcome": "completed"}
    post(first, f"/attempts/{attempt.pk}/exit", done)
    usage = AttemptUsage.objects.get(attempt=attempt)
    assert usage.gang_base_gpu_ms == 2 * PER_NODE_MS and usage.gang_base_at is not None
    _first_part_ended_seconds_ago(attempt, nodes[0], 20.5)  # whole seconds are billed: 20
    stopped = {"seq": 2, "cumulative_gpu_ms": PER_NODE_MS + 4 * 20_000, "exit_code": None, "signal": 15,
               "outcome": "cancelled"}
    post(second, f"/attempts/{attempt.pk}/exit", stopped)
    attempt.hold.refresh_from_db()
    assert attempt.hold.captured == 2 * PER_NODE_MS + 4 * 20_000
    usage.refresh_from_db()
    assert usage.billable_gpu_ms == usage.captured_gpu_ms == 2 * PER_NODE_MS + 4 * 20_000


def test_a_lost_parts_silence_after_its_last_report_is_not_billed(gang: Any) -> None:
    """The part on the second node reported 5 s after the first part exited, then its node went
    silent; it is ended (lost) later: billed to its last report, not to when it was ended."""
    from scheduling.services.lifecycle import finish_attempt

    attempt, (first, second), nodes = gang
    _start_both(attempt, [first, second])
    done = {"seq": 1, "cumulative_gpu_ms": PER_NODE_MS, "exit_code": 0, "signal": None,
            "outcome": "completed"}
    post(first, f"/attempts/{attempt.pk}/exit", done)
    _first_part_ended_seconds_ago(attempt, nodes[0], 300)
    usage = AttemptUsage.objects.get(attempt=attempt)
    last_report = usage.gang_base_at + timedelta(seconds=5)
    AttemptUsage.objects.filter(pk=usage.pk).update(
        part_reports={**usage.part_reports, str(nodes[1].pk): last_report.isoformat()})
    finish_attempt(attempt=JobAttempt.objects.get(pk=attempt.pk), outcome="lost")
    attempt.hold.refresh_from_db()
    assert attempt.hold.captured == 2 * PER_NODE_MS + 4 * 5_000


def test_parts_that_end_within_a_second_of_each_other_bill_as_before(gang: Any) -> None:
    attempt, (first, second), _nodes = gang
    _start_both(attempt, [first, second])
    done = {"seq": 1, "cumulative_gpu_ms": PER_NODE_MS, "exit_code": 0, "signal": None,
            "outcome": "completed"}
    post(first, f"/attempts/{attempt.pk}/exit", done)
    post(second, f"/attempts/{attempt.pk}/exit", {**done, "outcome": "cancelled"})
    attempt.hold.refresh_from_db()
    assert attempt.hold.captured == 2 * PER_NODE_MS
