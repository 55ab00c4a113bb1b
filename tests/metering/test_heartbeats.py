"""Heartbeat ingestion: one UPDATE per batch, max-wins, capped by the DB clock, node-scoped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from metering.heartbeats import HeartbeatItem, merge
from metering.models import AttemptUsage
from metering.services import ingest_heartbeats
from scheduling.models import AttemptState, JobAttempt, Node, NodeState
from tests.metering.conftest import World


def usage(attempt: JobAttempt) -> AttemptUsage:
    return AttemptUsage.objects.get(pk=attempt.pk)


def test_batch_is_one_statement_and_touches_only_usage_and_node(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    funded()
    attempts = [make_attempt(gpus=(i,)) for i in range(4)]
    items = [HeartbeatItem(a.pk, 1, 1000 * (i + 1), 50.0, 100) for i, a in enumerate(attempts)]
    with CaptureQueriesContext(connection) as ctx:
        result = ingest_heartbeats(node=world.node, items=items)
    assert result.accepted == sorted(a.pk for a in attempts)
    assert result.rejected == []
    writes = [q["sql"] for q in ctx.captured_queries if "UPDATE" in q["sql"]]
    assert len(writes) == 1  # usage rows and node liveness in one statement
    assert "ledger_" not in writes[0] and "budgets_" not in writes[0]
    assert [usage(a).billable_gpu_ms for a in attempts] == [1000, 2000, 3000, 4000]
    world.node.refresh_from_db()
    assert world.node.last_heartbeat_at is not None


def test_duplicates_and_reordering_keep_the_maximum(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    funded()
    a = make_attempt()
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 3, 30_000, 90.0, 7)])
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 2, 20_000, 10.0, 1)])
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 3, 30_000, 90.0, 7)] * 3)
    u = usage(a)
    assert (u.last_seq, u.reported_gpu_ms, u.billable_gpu_ms) == (3, 30_000, 30_000)
    assert (u.gpu_utilization, u.memory_used_mb) == (90.0, 7)  # telemetry of the newest seq only


def test_billable_is_capped_by_db_elapsed_time(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    funded()
    a = make_attempt(gpus=(0, 1), started_ago=10)  # 10 s x 2 GPUs = 20,000 gpu-ms observed
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 10**9)])  # a lying agent
    u = usage(a)
    assert u.reported_gpu_ms == 10**9
    # 20,000 x 1.01 + 2 x 5,000 slack (+ the few ms the test itself took)
    assert 30_200 <= u.billable_gpu_ms < 31_000


def test_attempts_of_other_nodes_or_not_running_are_rejected(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    funded()
    other = Node.objects.create(
        name="h100-2", region=world.region, gpu_type=world.h100, gpu_count=8, state=NodeState.READY
    )
    mine = make_attempt(gpus=(0,))
    theirs = make_attempt(gpus=(0,), node=other)
    scheduled = make_attempt(gpus=(1,), state=AttemptState.SCHEDULED)
    result = ingest_heartbeats(
        node=world.node,
        items=[
            HeartbeatItem(mine.pk, 1, 5),
            HeartbeatItem(theirs.pk, 1, 5),
            HeartbeatItem(scheduled.pk, 1, 5),
            HeartbeatItem(999_999_999, 1, 5),
        ],
    )
    assert result.accepted == [mine.pk]
    assert result.rejected == sorted([theirs.pk, scheduled.pk, 999_999_999])
    assert usage(theirs).reported_gpu_ms == 0


def test_merge_collapses_repeats_like_sequential_application() -> None:
    items = [HeartbeatItem(1, 2, 50, 1.0, 1), HeartbeatItem(1, 5, 40, 5.0, 5), HeartbeatItem(2, 1, 7)]
    assert merge(items) == [HeartbeatItem(1, 5, 50, 5.0, 5), HeartbeatItem(2, 1, 7)]


def test_stop_requests_ride_on_the_response(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    funded()
    a = make_attempt()
    JobAttempt.objects.filter(pk=a.pk).update(
        state=AttemptState.STOPPING, stop_reason="preempted", grace_seconds=15
    )
    result = ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 100)])
    assert result.accepted == [a.pk]
    assert result.stop == [{"attempt_id": a.pk, "reason": "preempted", "grace_seconds": 15}]


def test_an_attempt_the_server_ended_as_lost_is_stopped_as_lost(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """Its node was silent long enough for the server to end it; the agent, back, still runs it and
    is told why (QA: its log said "stopping (cancelled)")."""
    funded()
    a = make_attempt()
    JobAttempt.objects.filter(pk=a.pk).update(state=AttemptState.ENDED, outcome="lost")
    result = ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 100)])
    assert result.stop == [{"attempt_id": a.pk, "reason": "lost", "grace_seconds": 0}]
    # Withdrawn (its node went silent before it started) reads the same to the agent.
    JobAttempt.objects.filter(pk=a.pk).update(outcome="withdrawn")
    result = ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 2, 100)])
    assert result.stop == [{"attempt_id": a.pk, "reason": "lost", "grace_seconds": 0}]


def test_portable_path_bills_exactly_like_the_one_statement_path(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """The embedded (SQLite) mode applies heartbeats row by row; same inputs, same usage rows."""
    from metering.heartbeats import _apply_usage_portable, apply_usage

    funded()
    fast = [make_attempt(gpus=(0, 1), started_ago=10), make_attempt(gpus=(2,), started_ago=10)]
    slow = [make_attempt(gpus=(3, 4), started_ago=10), make_attempt(gpus=(5,), started_ago=10)]
    batches = [
        [(0, 2, 8_000, 40.0, 10), (1, 1, 3_000, 20.0, 5)],
        [(0, 1, 4_000, 99.0, 99), (1, 3, 10**9, 70.0, 7)],  # late seq; a lying agent
        [(0, 2, 8_000, 40.0, 10)],  # duplicate
    ]
    for batch in batches:
        apply_usage(node_id=world.node.pk, items=[HeartbeatItem(fast[i].pk, *rest) for i, *rest in batch])
        _apply_usage_portable(
            node_id=world.node.pk,
            items=[HeartbeatItem(slow[i].pk, *rest) for i, *rest in batch],
            touch_node=True,
            with_stops=False,
        )
    for a, b in zip(fast, slow, strict=True):
        ua, ub = usage(a), usage(b)
        assert (ua.last_seq, ua.reported_gpu_ms, ua.gpu_utilization, ua.memory_used_mb) == (
            ub.last_seq, ub.reported_gpu_ms, ub.gpu_utilization, ub.memory_used_mb
        )
        # The cap depends on the DB clock at each call: equal up to the test's own duration.
        assert abs(ua.billable_gpu_ms - ub.billable_gpu_ms) < 500
    assert usage(fast[1]).billable_gpu_ms < 20_000  # capped: 10 s x 1 GPU x 1.01 + 5 s slack


def test_an_older_batch_never_moves_last_seq_back(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """Mutation testing round 2: after seq 5, a late seq 3 leaves last_seq at 5, so a later but
    still older seq 4 cannot overwrite the newest telemetry."""
    funded()
    a = make_attempt()
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 5, 50_000, 90.0, 7)])
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 3, 30_000, 10.0, 1)])
    assert usage(a).last_seq == 5
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 4, 40_000, 20.0, 2)])
    u = usage(a)
    assert (u.last_seq, u.reported_gpu_ms, u.gpu_utilization, u.memory_used_mb) == (5, 50_000, 90.0, 7)


def test_merge_keeps_the_highest_seq_whatever_the_order() -> None:
    items = [HeartbeatItem(1, 5, 40, 5.0, 5), HeartbeatItem(1, 2, 50, 1.0, 1)]
    assert merge(items) == [HeartbeatItem(1, 5, 50, 5.0, 5)]
