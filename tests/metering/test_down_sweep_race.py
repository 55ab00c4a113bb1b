"""The down-node sweep racing the node's return, on real connections (review).

`end_attempts_on_down_nodes` read the attempts of down nodes, then finished each `lost` without
re-checking: a node that answered while the sweep waited for a job's lock (a charge, a scheduling
pass) had its running attempt ended `lost` (settled, requeued with a retry spent), and the job
still running there was then killed by a `lost` stop. Now each attempt is re-checked under the
job's and the attempt's locks, with its node's row locked FOR SHARE. Failed before.

A heartbeat arriving while the sweep holds that share lock waits for it, and does not deadlock with
the settlement: its one statement updates the usage row, then the node, so the sweep locks the
usage row before the node (review: a first version locked the node first, and PostgreSQL aborted
the heartbeat or the sweep)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from ledger.models import MICRO
from metering.heartbeats import HeartbeatItem
from metering.services import ingest_heartbeats
from scheduling.models import AttemptState, Job, JobAttempt, Node, NodeState
from scheduling.services import tick
from scheduling.services.tick import end_attempts_on_down_nodes
from tests.lock_waits import another_session_waits
from tests.metering.conftest import World
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def _running_on_a_node_gone_down(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> JobAttempt:
    funded(100 * MICRO)
    attempt = make_attempt(started_ago=600)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, 1_000_000)])
    Node.objects.filter(pk=world.node.pk).update(
        state=NodeState.DOWN, last_heartbeat_at=timezone.now() - timedelta(seconds=400))
    return attempt


def test_a_node_back_before_the_down_sweep_ends_its_attempt_keeps_the_attempt(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    attempt = _running_on_a_node_gone_down(world, funded, make_attempt)
    locked, release = threading.Event(), threading.Event()

    def hold_the_job() -> None:  # as a charge or a scheduling pass would
        with transaction.atomic():
            Job.objects.select_for_update().get(pk=attempt.job_id)
            locked.set()
            release.wait(30)

    holder = Worker(hold_the_job).start()
    assert locked.wait(10)
    sweeper = Worker(end_attempts_on_down_nodes).start()
    assert another_session_waits(sweeper.done)  # the sweep has read the attempt and waits for the job
    result = ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 2, 1_060_000)])
    assert result.accepted == [attempt.pk]
    assert Node.objects.get(pk=world.node.pk).state == NodeState.READY
    release.set()
    holder.join()
    sweeper.join()
    assert holder.errors == sweeper.errors == []

    attempt.refresh_from_db()
    next_beat = ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 3, 1_120_000)])
    assert (attempt.state, attempt.outcome, next_beat.stop) == (AttemptState.RUNNING, "", [])


def test_a_heartbeat_during_the_sweeps_re_check_waits_and_does_not_deadlock(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt], monkeypatch: pytest.MonkeyPatch,
) -> None:
    attempt = _running_on_a_node_gone_down(world, funded, make_attempt)
    beat = Worker(lambda: ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 2, 1_060_000)]))
    recheck = tick._its_nodes_that_are

    def recheck_then_heartbeat(locked: JobAttempt, state: str) -> list[int]:
        answer = recheck(locked, state)  # the usage row and the node are locked now
        if beat.thread.ident is None:  # not started yet: the first re-check
            beat.start()
            assert another_session_waits(beat.done)
        return answer

    monkeypatch.setattr(tick, "_its_nodes_that_are", recheck_then_heartbeat)
    assert tick._end_lost(attempt.pk, attempt.job_id)  # one transaction, as the sweep runs it
    assert beat.join().errors == []
    attempt.refresh_from_db()
    assert (attempt.state, attempt.outcome) == (AttemptState.ENDED, "lost")  # the sweep came first
