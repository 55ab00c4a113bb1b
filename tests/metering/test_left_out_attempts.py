"""An attempt its node keeps heartbeating without (the agent no longer runs it: QA saw an exit report
refused with a 400 and dropped, the job `running` for good, its GPUs and credits held, a cancel
never answered) is ended `lost` by the node sweep once left out for
METERING_UNREPORTED_ATTEMPT_AFTER_S, and settled."""

from __future__ import annotations

from typing import Any

from django.db import connection

from ledger.models import HoldState
from scheduling.models import AttemptState, JobState, Node
from scheduling.services.tick import sweep_nodes
from tests.metering.conftest import World


def _ago(table: str, column: str, seconds: float, where: str, pk: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(  # test tables and columns, not input
            f"UPDATE {table} SET {column} = now() - make_interval(secs => %s) WHERE {where} = %s",  # noqa: S608
            [seconds, pk])


def _left_out_for(attempt: Any, seconds: float) -> None:
    """Last reported `seconds` ago; allocated an hour ago on the DB clock (the factory uses Python's,
    later than this test transaction's now())."""
    _ago("metering_attemptusage", "last_heartbeat_at", seconds, "attempt_id", attempt.pk)
    _ago("scheduling_allocation", "allocated_at", 3600, "attempt_id", attempt.pk)
    _ago("scheduling_allocation", "started_at", 3600, "attempt_id", attempt.pk)


def test_an_attempt_its_live_node_leaves_out_is_ended_lost_and_settled(
    world: World, funded: Any, make_attempt: Any
) -> None:
    funded()
    attempt = make_attempt(started_ago=3600)
    reported = make_attempt(gpus=(2, 3), started_ago=3600)
    _left_out_for(attempt, 600)
    _left_out_for(reported, 10)
    Node.objects.filter(pk=world.node.pk).update(state="ready")
    _ago("scheduling_node", "last_heartbeat_at", 5, "id", world.node.pk)  # heartbeating

    assert sweep_nodes()["lost"] == 1
    attempt.refresh_from_db()
    assert (attempt.state, attempt.outcome) == (AttemptState.ENDED, "lost")
    assert attempt.job.state == JobState.QUEUED  # retried, as after a node loss
    attempt.hold.refresh_from_db()
    assert attempt.hold.state == HoldState.SETTLED
    reported.refresh_from_db()
    assert reported.state == AttemptState.RUNNING  # reported 10 s ago: untouched


def test_left_out_for_less_than_the_limit_it_runs_on_and_a_cancelled_one_ends_cancelled(
    world: World, funded: Any, make_attempt: Any
) -> None:
    funded()
    attempt = make_attempt(started_ago=3600)
    _left_out_for(attempt, 200)  # 200 s of heartbeats without it: under the 300 s limit
    Node.objects.filter(pk=world.node.pk).update(state="ready")
    _ago("scheduling_node", "last_heartbeat_at", 1, "id", world.node.pk)
    sweep_nodes()
    attempt.refresh_from_db()
    assert attempt.state == AttemptState.RUNNING
    # A cancelled attempt left out ends as the user asked.
    fresh = make_attempt(gpus=(4,), started_ago=3600)
    _left_out_for(fresh, 600)
    _ago("scheduling_node", "last_heartbeat_at", 1, "id", world.node.pk)
    from scheduling.services.lifecycle import request_stop

    request_stop(attempt=fresh, reason="cancelled")
    sweep_nodes()
    fresh.refresh_from_db()
    assert (fresh.state, fresh.outcome) == (AttemptState.ENDED, "cancelled")
    assert fresh.job.state == JobState.CANCELLED
