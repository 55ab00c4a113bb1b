"""One scheduling pass (load -> core -> write, one transaction, under the leader lock) and the
node-health sweep that turns silent nodes unknown, then down, and ends their attempts as `lost`."""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from time import perf_counter

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count

from audit.services import record
from config import metrics
from config.clock import db_now
from ledger.retry import retry_on_conflict
from metering import conf as metering_conf
from metering.models import AttemptUsage
from metering.settlement import lock_usage
from scheduling import core
from scheduling.adapter.snapshot import load_snapshot
from scheduling.adapter.writer import apply_result
from scheduling.models import (
    Allocation,
    AttemptState,
    JobAttempt,
    JobState,
    Node,
    NodeCordon,
    NodeState,
    SchedulerPass,
)
from scheduling.services.leader import try_lead
from scheduling.services.lifecycle import end_gang_part, finish_attempt, lock_job, request_stop

log = logging.getLogger("scheduling.tick")


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """No cyclic garbage collection during a pass; it runs after, as usual.

    A pass keeps the snapshot's objects alive (10,000 pending jobs: hundreds of thousands of
    objects) while allocating many more, so the collector's full collections, which walk every
    live object, landed inside passes at random and added ~100 ms to the core's phase
    (docs/benchmarks.md, scheduler tick). Refcounting still frees everything acyclic at once.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@retry_on_conflict()
def run_scheduling_pass(*, trigger: str = "beat") -> SchedulerPass | None:
    """Run one pass; None when another process is the leader right now (nothing was done)."""
    started = perf_counter()
    with _gc_paused(), transaction.atomic():
        if not try_lead():
            return None
        now = db_now()
        loaded = load_snapshot(now=now)
        loaded_at = perf_counter()
        result = core.schedule(loaded.snapshot)
        decided_at = perf_counter()
        applied = apply_result(loaded=loaded, result=result)
        written_at = perf_counter()
        total = written_at - started
        row = SchedulerPass.objects.create(
            started_at=now,
            finished_at=now + timedelta(seconds=total),
            trigger=trigger[:32],
            pending=len(loaded.snapshot.pending),
            placed=len(applied.placed),
            preempted=applied.preempted,
            backfilled=applied.backfilled,
            waiting_changed=applied.reasons_changed,
            conflicts=len(applied.conflicts),
            load_ms=_ms(loaded_at - started),
            core_ms=_ms(decided_at - loaded_at),
            write_ms=_ms(written_at - decided_at),
            total_ms=_ms(total),
        )
    log.info(
        "scheduler pass %s (%s): pending=%s placed=%s preempted=%s load=%sms core=%sms write=%sms",
        row.pk, trigger, row.pending, row.placed, row.preempted, row.load_ms, row.core_ms, row.write_ms,
    )
    metrics.scheduler_pass(
        load_s=loaded_at - started, core_s=decided_at - loaded_at, write_s=written_at - decided_at,
        pending_classes=[job.priority_class for job in loaded.snapshot.pending],
        placed=row.placed, preempted=row.preempted, backfilled=row.backfilled,
    )
    return row


def _node_timeouts() -> tuple[timedelta, timedelta]:
    # The metering engineer owns heartbeats and their timeouts (metering/conf.py).
    from metering.conf import seconds

    return (
        timedelta(seconds=seconds("METERING_NODE_UNKNOWN_AFTER_S")),
        timedelta(seconds=seconds("METERING_NODE_DOWN_AFTER_S")),
    )


def _mark_nodes(
    ids: list[int], *, from_states: tuple[str, ...], to: str, silent_before: datetime, reason: str
) -> list[int]:
    """Move nodes still silent and still in `from_states` to `to` (a conditional locked read, so a
    heartbeat that arrived meanwhile wins); audit each move with the state it left."""
    moved: list[int] = []
    for node_id in ids:
        with transaction.atomic():
            # A locked read first (no_key, as `mark_node_alive`'s): the event says from what, as
            # that one's does (QA: the unknown/down events had only `to`).
            node = (Node.objects.select_for_update(no_key=True)
                    .filter(pk=node_id, state__in=from_states, last_heartbeat_at__lt=silent_before)
                    .values_list("state", "cordon").first())
            if node is None:
                continue
            Node.objects.filter(pk=node_id).update(state=to)
            record(action="sched.node.state", subject_type="node", subject_id=node_id,
                   reason_code=reason, data={"from": node[0], "to": to, "cordon": node[1]})
            moved.append(node_id)
    return moved


def sweep_nodes(*, limit: int = 200) -> dict[str, int]:
    """Silent nodes become unknown, then down; attempts on down nodes end as `lost` (requeued)."""
    unknown_after, down_after = _node_timeouts()
    now = db_now()
    alive = (NodeState.READY,)
    silent = list(
        Node.objects.filter(state__in=alive, last_heartbeat_at__lt=now - unknown_after)
        .values_list("id", flat=True)[:limit]
    )
    went_unknown = _mark_nodes(silent, from_states=alive, to=NodeState.UNKNOWN,
                               silent_before=now - unknown_after, reason="heartbeat-missed")
    dead = list(
        Node.objects.filter(state=NodeState.UNKNOWN, last_heartbeat_at__lt=now - down_after)
        .values_list("id", flat=True)[:limit]
    )
    went_down = _mark_nodes(dead, from_states=(NodeState.UNKNOWN,), to=NodeState.DOWN,
                            silent_before=now - down_after, reason="node-down")
    lost = end_attempts_on_down_nodes(limit=limit) + end_attempts_their_nodes_leave_out(limit=limit)
    withdrawn = withdraw_unstarted_from_silent_nodes(limit=limit)
    evicted = evict_from_nodes_out_of_service(limit=limit)
    overdue = stop_overdue_attempts(limit=limit)
    counts = Node.objects.values_list("state", "cordon").annotate(n=Count("id")).order_by()
    metrics.nodes_by_state({(state, cordon): n for state, cordon, n in counts})
    return {"unknown": len(went_unknown), "down": len(went_down), "lost": lost, "withdrawn": withdrawn,
            "evicted": evicted, "overdue": overdue}


OVERDUE_SLACK_SECONDS = 60


def stop_overdue_attempts(*, limit: int = 200) -> int:
    """Ask for the stop of attempts running past their max wall time plus the stop grace and a
    minute: the agent enforces max wall, and should it not (a wedged runner, an old agent) while its
    node still answers, the server does, so GPUs are never held by a job that should have ended
    (billing is capped at the max wall time anyway). Silent nodes are the node sweep's business."""
    now = db_now()
    grace = int(getattr(settings, "SCHEDULER_STOP_GRACE_SECONDS", 30))
    running = (
        JobAttempt.objects.filter(state=AttemptState.RUNNING, started_at__isnull=False,
                                  allocations__released_at__isnull=True,
                                  allocations__node__state=NodeState.READY)
        .values_list("pk", "started_at", "job__max_wall_seconds").distinct().order_by("pk")
    )
    overdue = [
        pk for pk, started, wall in running
        if started + timedelta(seconds=wall + grace + OVERDUE_SLACK_SECONDS) < now
    ][:limit]
    for attempt in JobAttempt.objects.filter(pk__in=overdue).order_by("pk"):
        request_stop(attempt=attempt, reason="timed_out", grace_seconds=grace)
    return len(overdue)


def evict_from_nodes_out_of_service(*, limit: int = 200, node_ids: list[int] | None = None) -> int:
    """Stop the live attempts on nodes an operator took out of service (`cordon = down`) with the
    preemption grace (signal, then kill); each is requeued when its agent reports the exit, with no
    retry counted and no backoff: the node was taken away, the job did nothing wrong. A node whose
    health is `down` is not asked (its agent is gone): `end_attempts_on_down_nodes` ends those."""
    attempts = (
        JobAttempt.objects.filter(
            state__in=(AttemptState.SCHEDULED, AttemptState.RUNNING),
            allocations__released_at__isnull=True,
            allocations__node__cordon=NodeCordon.DOWN,
        ).exclude(allocations__node__state=NodeState.DOWN)
    )
    if node_ids is not None:
        attempts = attempts.filter(allocations__node_id__in=node_ids)
    attempts = list(attempts.distinct().order_by("pk")[:limit])
    grace = int(getattr(settings, "SCHEDULER_PREEMPT_GRACE_SECONDS", core.Config().grace_seconds))
    asked = 0
    for attempt in attempts:
        stopped = request_stop(attempt=attempt, reason="evicted", grace_seconds=grace)
        asked += stopped.stop_reason == "evicted"
    return asked


_UNSTARTED = (AttemptState.SCHEDULED, AttemptState.STOPPING)


def withdraw_unstarted_from_silent_nodes(*, limit: int = 200) -> int:
    """End the attempts placed on a node that went silent (`unknown`) before its agent was known to
    start them, as `withdrawn` (or by the stop already asked of one): requeued at once, no retry
    counted, no backoff (QA: such a job sat `scheduled`, unexplained, until the node was declared
    down minutes later, and then spent a retry). Each is re-checked under the job's and the
    attempt's locks (a `/started` report or a heartbeat that brought the node back wins). Should the
    agent have started it unreported (a partition), the attempt is stale when it comes back and the
    agent is told to stop it; what it ran meanwhile is not billed."""
    ids = list(
        JobAttempt.objects.filter(
            state__in=_UNSTARTED, started_at__isnull=True,
            allocations__released_at__isnull=True, allocations__node__state=NodeState.UNKNOWN,
        ).distinct().order_by("pk").values_list("pk", "job_id")[:limit]
    )
    withdrawn = 0
    for attempt_id, job_id in ids:
        try:
            withdrawn += _withdraw(attempt_id, job_id)
        except Exception:  # one bad attempt must not block the sweep of the others
            log.exception("could not withdraw attempt %s from a silent node", attempt_id)
    return withdrawn


def _still_on_a_node_that_is(attempt: JobAttempt, state: str) -> bool:
    return bool(_its_nodes_that_are(attempt, state))


def _its_nodes_that_are(attempt: JobAttempt, state: str) -> list[int]:
    """Whether the attempt still holds a GPU of a node in `state`, asked under the attempt's lock.
    On PostgreSQL the node row is locked FOR SHARE: a heartbeat that brings the node back (an
    UPDATE of its row) is seen here if it committed, or waits until this transaction has ended
    the attempt (and is then told to stop it). The attempt's usage row is locked first: a
    heartbeat's one statement updates the usage rows, then the node, and the settlement that
    ends the attempt locks the usage row (review: taken after the node, it deadlocked with a
    heartbeat of the node coming back). SQLite runs one writer at a time."""
    lock_usage(attempt)
    lock = " FOR SHARE OF n" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT n.id FROM {Node._meta.db_table} n JOIN {Allocation._meta.db_table} a "  # noqa: S608
            "ON a.node_id = n.id WHERE a.attempt_id = %s AND a.released_at IS NULL AND n.state = %s "
            f"ORDER BY n.id{lock}",
            [attempt.pk, state],
        )
        return sorted({row[0] for row in cursor.fetchall()})


@transaction.atomic
def _withdraw(attempt_id: int, job_id: int) -> bool:
    lock_job(job_id)  # lock order: job, then attempt (finish_attempt takes them again)
    attempt = JobAttempt.objects.select_for_update().get(pk=attempt_id)
    if attempt.state not in _UNSTARTED or attempt.started_at is not None:
        return False  # started or ended since the sweep read it
    if not _still_on_a_node_that_is(attempt, NodeState.UNKNOWN):
        return False  # its node is back
    return finish_attempt(attempt=attempt, outcome="withdrawn").state == JobState.QUEUED


_LIVE = (AttemptState.SCHEDULED, AttemptState.RUNNING, AttemptState.STOPPING)


def end_attempts_on_down_nodes(*, limit: int = 200) -> int:
    """Finish every live attempt holding a GPU of a down node with outcome `lost` (one transaction
    each), re-checked under the job's and the attempt's locks: a heartbeat that brought the node
    back while the sweep waited for a lock wins (review: the attempt of a node back `ready` was
    ended `lost`, a retry spent, and the job still running there then killed)."""
    ids = list(
        JobAttempt.objects.filter(
            state__in=_LIVE, allocations__released_at__isnull=True, allocations__node__state=NodeState.DOWN,
        ).distinct().order_by("pk").values_list("pk", "job_id")[:limit]
    )
    ended = 0
    for attempt_id, job_id in ids:
        try:
            ended += _end_lost(attempt_id, job_id)
        except Exception:  # one bad attempt must not block the sweep of the others
            log.exception("could not end attempt %s of a down node", attempt_id)
    return ended


_LEFT_OUT_SQL = f"""
    SELECT DISTINCT a.id, a.job_id, al.node_id
    FROM {JobAttempt._meta.db_table} a
    JOIN {Allocation._meta.db_table} al
      ON al.attempt_id = a.id AND al.released_at IS NULL AND al.started_at IS NOT NULL
    JOIN {Node._meta.db_table} n ON n.id = al.node_id AND n.state = %(ready)s
    LEFT JOIN {AttemptUsage._meta.db_table} u ON u.attempt_id = a.id
    WHERE a.state IN (%(running)s, %(stopping)s) AND a.started_at IS NOT NULL
      AND (%(attempt)s::bigint IS NULL OR a.id = %(attempt)s::bigint)
      AND n.last_heartbeat_at > %(after)s + CASE
        -- a gang: when this node last reported its part (or started it); a row with no part
        -- reports at all (written before them) is judged as a whole, as a single node's
        WHEN a.node_count > 1 AND u.part_reports IS NOT NULL
          THEN COALESCE((u.part_reports ->> al.node_id::text)::timestamptz, al.started_at)
        ELSE COALESCE(u.last_heartbeat_at, a.started_at) END
    ORDER BY a.id, al.node_id
    LIMIT %(limit)s
"""  # noqa: S608


def _left_out(
    after: timedelta, *, attempt_id: int | None = None, limit: int = 200
) -> list[tuple[int, int, int]]:
    """(attempt, job, node) of started parts on ready nodes that have heartbeated for `after` since
    they last reported the part (or started it) without reporting it: their agent does not run it.
    A gang's parts are judged node by node (`AttemptUsage.part_reports`; review: one usage row per
    attempt hid a part its node had dropped while another part reported)."""
    if connection.vendor != "postgresql":
        return _left_out_portable(after, attempt_id=attempt_id, limit=limit)
    params = {"ready": NodeState.READY, "running": AttemptState.RUNNING, "stopping": AttemptState.STOPPING,
              "attempt": attempt_id, "after": after, "limit": limit}
    with connection.cursor() as cursor:
        cursor.execute(_LEFT_OUT_SQL, params)
        return [tuple(row) for row in cursor.fetchall()]


def _left_out_portable(after: timedelta, *, attempt_id: int | None, limit: int) -> list[tuple[int, int, int]]:
    """`_LEFT_OUT_SQL`'s rule in Python, for the embedded SQLite mode (review: the sweep raised there)."""
    parts = Allocation.objects.filter(
        released_at__isnull=True, started_at__isnull=False, node__state=NodeState.READY,
        attempt__state__in=(AttemptState.RUNNING, AttemptState.STOPPING), attempt__started_at__isnull=False,
    )
    if attempt_id is not None:
        parts = parts.filter(attempt_id=attempt_id)
    found: set[tuple[int, int, int]] = set()
    for a_id, job_id, node_id, node_seen, part_started, started, nodes, seen, reports in parts.values_list(
        "attempt_id", "attempt__job_id", "node_id", "node__last_heartbeat_at", "started_at",
        "attempt__started_at", "attempt__node_count", "attempt__usage__last_heartbeat_at",
        "attempt__usage__part_reports",
    ):
        if nodes > 1 and reports is not None:
            reported = reports.get(str(node_id))
            last = datetime.fromisoformat(reported) if reported else part_started
        else:
            last = seen or started
        if node_seen is not None and node_seen > last + after:
            found.add((a_id, job_id, node_id))
    return sorted(found)[:limit]


def end_attempts_their_nodes_leave_out(*, limit: int = 200) -> int:
    """End as `lost` the attempts whose node keeps heartbeating without them (QA: an exit report the
    server refused was dropped by the agent, and the job stayed `running`, its GPUs and credits held,
    a cancel never answered). A heartbeat carries every attempt its agent runs (and those whose exit
    report is on its way), so one left out of them all for METERING_UNREPORTED_ATTEMPT_AFTER_S (5 min;
    10 heartbeats) has ended there unseen. A gang's part is ended alone while other parts run
    (`end_gang_part`). Re-checked under the job, attempt and usage locks (a heartbeat updates the
    usage row)."""
    after = timedelta(seconds=metering_conf.value("METERING_UNREPORTED_ATTEMPT_AFTER_S"))
    ids = sorted({(attempt_id, job_id) for attempt_id, job_id, _node in _left_out(after, limit=limit)})
    ended = 0
    for attempt_id, job_id in ids:
        try:
            ended += _end_left_out(attempt_id, job_id, after)
        except Exception:  # one bad attempt must not block the sweep of the others
            log.exception("could not end attempt %s left out of its node's heartbeats", attempt_id)
    return ended


@transaction.atomic
def _end_left_out(attempt_id: int, job_id: int, after: timedelta) -> bool:
    lock_job(job_id)
    attempt = JobAttempt.objects.select_for_update().get(pk=attempt_id)
    lock_usage(attempt)
    nodes = [node_id for _a, _j, node_id in _left_out(after, attempt_id=attempt_id)]
    if not nodes:
        return False  # reported, ended or its node silent since the sweep read it
    log.warning("attempt %s: nodes %s have not reported it for %s; ending it there lost", attempt_id, nodes,
                after)
    _end_parts_lost(attempt, nodes)
    return True


def _end_parts_lost(attempt: JobAttempt, node_ids: list[int]) -> None:
    """End the attempt's parts on these nodes `lost`. A gang with parts still running on other
    nodes: only those parts end here; the others are stopped and keep their GPUs until they exit
    (review: every part's GPUs were handed to the next job while the live parts still ran). The
    last part ends the attempt. Caller holds the job and attempt locks."""
    for node_id in node_ids:
        if not end_gang_part(attempt=attempt, node_id=node_id, outcome="lost", exit_code=None):
            finish_attempt(attempt=attempt, outcome="lost")
            return
        attempt.refresh_from_db()


@transaction.atomic
def _end_lost(attempt_id: int, job_id: int) -> bool:
    lock_job(job_id)  # lock order: job, then attempt (finish_attempt takes them again)
    attempt = JobAttempt.objects.select_for_update().get(pk=attempt_id)
    down = _its_nodes_that_are(attempt, NodeState.DOWN) if attempt.state in _LIVE else []
    if not down:
        return False  # ended, or its node back, since the sweep read it
    _end_parts_lost(attempt, down)
    return True
