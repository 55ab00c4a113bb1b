"""Heartbeat ingestion: the hot path (DESIGN.md §8, §9).

One request per node carries every running attempt on it. The whole batch is applied by ONE
statement: an `UPDATE … FROM (unnest(arrays))` - the same plan as `UPDATE … FROM (VALUES …)`, with
five bound arrays instead of five parameters per attempt - over the attempts' usage rows, joined to
the attempt (state, start time on the DB clock, GPU count) and to its live allocation on *this*
node, with the node's liveness stamp and the node's stop requests folded into the same statement.
No bucket, budget or hold row is touched: the hold already covers the money; `charge_progress`
turns usage into captures off the hot path.

A gang on several nodes (one attempt) is metered from each of its nodes: an agent reports the GPU-ms
of its own GPUs, and the server scales that to the gang's live GPUs (`x gang / here`), since the
gang holds all its GPUs for as long as any part runs; the attempt keeps the highest such figure,
i.e. the longest-running part's time on every GPU of the gang (review: the highest raw report was
kept, and an 8-GPU gang on two nodes was billed for 4 GPUs). Once a part has exited its GPUs are
released and no longer counted.

Idempotent by (attempt, seq) and order-free: the stored values only ever move forward
(`GREATEST`), so a duplicate, a replay or a late, reordered heartbeat changes nothing. Billable
usage is `min(max reported, elapsed since started_at x gpu_count x (1 + tolerance) + slack)`,
elapsed measured by the database clock: the agent's clock is never trusted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from django.db import connection, transaction
from django.db.models import Count, Q

from config.clock import db_now
from metering import conf
from metering.models import AttemptUsage
from scheduling.models import Allocation, AttemptState, JobAttempt, Node, NodeState
from scheduling.services.nodes import mark_node_alive

USAGE = AttemptUsage._meta.db_table
ATTEMPT = JobAttempt._meta.db_table
ALLOC = Allocation._meta.db_table
NODE = Node._meta.db_table
# Postgres' bigint ceiling: a value beyond it is a broken agent, not usage.
MAX_BIGINT = 2**63 - 1
# lost: the server already ended the attempt as lost (its node was silent) and it is still running.
STOP_REASONS = frozenset({"preempted", "evicted", "cancelled", "out_of_credit", "timed_out", "lost"})


@dataclass(frozen=True)
class HeartbeatItem:
    """One attempt's line in a heartbeat (agent values; only `cumulative_gpu_ms` can become money)."""

    attempt_id: int
    seq: int
    cumulative_gpu_ms: int
    gpu_utilization: float | None = None
    memory_used_mb: int | None = None


@dataclass
class IngestResult:
    """What one heartbeat did: accepted attempt ids, rejected ones, and stops to send back."""

    accepted: list[int] = field(default_factory=list)
    rejected: list[int] = field(default_factory=list)
    stop: list[dict[str, object]] = field(default_factory=list)


def merge(items: Iterable[HeartbeatItem]) -> list[HeartbeatItem]:
    """Collapse repeats of one attempt in a batch (an UPDATE … FROM joins a row at most once).

    Keeps the highest seq's telemetry and the highest cumulative value: exactly what applying the
    items one by one would leave behind.
    """
    best: dict[int, HeartbeatItem] = {}
    for item in items:
        seen = best.get(item.attempt_id)
        if seen is None:
            best[item.attempt_id] = item
            continue
        newest = item if item.seq > seen.seq else seen
        best[item.attempt_id] = HeartbeatItem(
            attempt_id=item.attempt_id,
            seq=max(item.seq, seen.seq),
            cumulative_gpu_ms=max(item.cumulative_gpu_ms, seen.cumulative_gpu_ms),
            gpu_utilization=newest.gpu_utilization,
            memory_used_mb=newest.memory_used_mb,
        )
    return [best[k] for k in sorted(best)]


# Heartbeats commit asynchronously (synchronous_commit=off for that transaction only): a crash
# can lose at most the last few hundred milliseconds of heartbeats, which the next heartbeat
# carries again because usage is cumulative. Money (captures, settlement) always commits
# synchronously. Never a correctness risk: the database stays consistent, only recent
# heartbeats may be forgotten.
ASYNC_COMMIT = True

# One constant statement per batch (the text never depends on the batch size): the items arrive as
# five parallel arrays, so binding costs five parameters, not five per attempt. Only table names
# and enum constants are interpolated; every value is a bound parameter.
HOT_SQL = f"""
    WITH cfg AS MATERIALIZED (
        -- Asynchronous commit for a standalone heartbeat (see ASYNC_COMMIT); the caller's setting
        -- otherwise. LATERAL below makes this run first, whatever the batch holds.
        SELECT set_config('synchronous_commit', CASE WHEN %(async)s::boolean THEN 'off'
                          ELSE current_setting('synchronous_commit') END, true) AS mode
    ),
    v AS (
        SELECT v.* FROM cfg CROSS JOIN LATERAL unnest(
            %(ids)s::bigint[], %(seqs)s::bigint[], %(ms)s::bigint[],
            %(utils)s::double precision[], %(mems)s::bigint[]) AS v (attempt_id, seq, gpu_ms, util, mem)
    ),
    ok AS (
        SELECT v.attempt_id, v.seq, v.util, v.mem, a.node_count > 1 AS gang,
               -- a gang's part: this node's GPU-ms scaled to the gang's live GPUs (module doc);
               -- evaluated only for attempts on several nodes
               CASE WHEN a.node_count > 1 THEN (
                   SELECT LEAST({MAX_BIGINT}, FLOOR(v.gpu_ms::numeric * count(*)
                                / NULLIF(count(*) FILTER (WHERE al.node_id = %(node)s), 0)))::bigint
                   FROM {ALLOC} al WHERE al.attempt_id = a.id AND al.released_at IS NULL
               ) ELSE v.gpu_ms END AS gpu_ms,
               -- the cap: elapsed on the DB clock x GPUs x (1 + ratio) + slack per GPU
               GREATEST(0, FLOOR(EXTRACT(EPOCH FROM (now() - a.started_at)) * 1000.0 * a.gpu_count
                                 * (1.0 + %(ratio)s::double precision)))::bigint
                   + %(slack)s::bigint * a.gpu_count AS cap
        FROM v JOIN {ATTEMPT} a ON a.id = v.attempt_id
        WHERE a.state IN ('{AttemptState.RUNNING}', '{AttemptState.STOPPING}')
          AND a.started_at IS NOT NULL
          AND EXISTS (SELECT 1 FROM {ALLOC} al WHERE al.attempt_id = a.id
                      AND al.node_id = %(node)s AND al.released_at IS NULL)
    ),
    touched AS (
        -- liveness on the DB clock (a silent node's return to ready is `nodes.mark_node_alive`'s)
        UPDATE {NODE} SET last_heartbeat_at = now()
        WHERE id = %(node)s AND %(touch)s::boolean
        RETURNING id, state
    ),
    upd AS (
        UPDATE {USAGE} u SET
            reported_gpu_ms = GREATEST(u.reported_gpu_ms, ok.gpu_ms),
            billable_gpu_ms = GREATEST(u.billable_gpu_ms,
                                       LEAST(GREATEST(u.reported_gpu_ms, ok.gpu_ms), ok.cap)),
            last_seq = GREATEST(u.last_seq, ok.seq),
            gpu_utilization = CASE WHEN ok.seq > u.last_seq THEN ok.util ELSE u.gpu_utilization END,
            memory_used_mb = CASE WHEN ok.seq > u.last_seq THEN ok.mem ELSE u.memory_used_mb END,
            last_heartbeat_at = now(),
            part_reports = CASE WHEN ok.gang THEN jsonb_set(COALESCE(u.part_reports, '{{}}'::jsonb),
                                                            ARRAY[%(node)s::text], to_jsonb(now()))
                           ELSE u.part_reports END
        -- settled_at is re-checked on the row itself after a lock wait (EvalPlanQual), so a
        -- heartbeat racing a settlement can never move usage that has already been billed.
        FROM ok WHERE u.attempt_id = ok.attempt_id AND u.settled_at IS NULL
        RETURNING u.attempt_id
    )
    SELECT 'accepted', attempt_id, NULL, NULL FROM upd
    UNION ALL
    SELECT 'silent', id, state, NULL::integer FROM touched WHERE state <> '{NodeState.READY}'
    UNION ALL
    SELECT 'stop', a.id, a.stop_reason, a.grace_seconds FROM {ATTEMPT} a
    WHERE %(stops)s::boolean AND a.state = '{AttemptState.STOPPING}'
      AND EXISTS (SELECT 1 FROM {ALLOC} al WHERE al.attempt_id = a.id
                  AND al.node_id = %(node)s AND al.released_at IS NULL)
"""  # noqa: S608


def apply_usage(
    *, node_id: int, items: Sequence[HeartbeatItem], touch_node: bool = True, with_stops: bool = False
) -> tuple[list[int], list[dict[str, object]]]:
    """Apply a batch in ONE statement; returns (accepted attempt ids, this node's stop requests)."""
    merged = merge(items)
    if connection.vendor != "postgresql":
        return _apply_usage_portable(
            node_id=node_id, items=merged, touch_node=touch_node, with_stops=with_stops
        )
    params = {
        "ids": [it.attempt_id for it in merged],
        "seqs": [it.seq for it in merged],
        "ms": [it.cumulative_gpu_ms for it in merged],
        "utils": [it.gpu_utilization for it in merged],
        "mems": [it.memory_used_mb for it in merged],
        "ratio": conf.value("METERING_CAP_TOLERANCE_RATIO"),
        "slack": conf.seconds("METERING_CAP_SLACK_MS_PER_GPU"),
        "node": node_id,
        "touch": touch_node,
        "stops": with_stops,
        # Only a statement that is its own transaction: inside a caller's atomic() (an exit report
        # settling money) the commit must stay synchronous.
        "async": ASYNC_COMMIT and not connection.in_atomic_block,
    }
    with connection.cursor() as cursor:
        cursor.execute(HOT_SQL, params)
        rows = cursor.fetchall()
    if any(row[0] == "silent" for row in rows):  # rare: this node was unknown or down until now
        mark_node_alive(node_id=node_id)
    accepted = sorted(row[1] for row in rows if row[0] == "accepted")
    stops: list[dict[str, object]] = [
        {"attempt_id": row[1], "reason": row[2] or "cancelled", "grace_seconds": row[3]}
        for row in sorted(rows, key=lambda r: r[1])
        if row[0] == "stop"
    ]
    return accepted, stops


def ensure_usage_rows(*, node_id: int, attempt_ids: Iterable[int]) -> list[int]:
    """Create missing usage rows for live, started attempts on this node; returns the ids created."""
    ids = list(attempt_ids)
    if not ids:
        return []
    live = list(
        JobAttempt.objects.filter(
            pk__in=ids,
            state__in=(AttemptState.RUNNING, AttemptState.STOPPING),
            started_at__isnull=False,
            allocations__node_id=node_id,
            allocations__released_at__isnull=True,
            usage__isnull=True,
        )
        .values_list("pk", "org_id")
        .distinct()
    )
    AttemptUsage.objects.bulk_create(
        [AttemptUsage(attempt_id=pk, org_id=org_id) for pk, org_id in live], ignore_conflicts=True
    )
    return [pk for pk, _ in live]


def stops_for_node(*, node_id: int, ended_ids: Iterable[int] = ()) -> list[dict[str, object]]:
    """Stop requests for this node: attempts asked to stop, plus reported attempts the server has
    already ended (e.g. settled as lost while the node was silent) - they must not keep the GPUs."""
    rows = list(
        JobAttempt.objects.filter(
            state=AttemptState.STOPPING,
            allocations__node_id=node_id,
            allocations__released_at__isnull=True,
        )
        .values_list("pk", "stop_reason", "grace_seconds")
        .distinct()
    )
    stops: list[dict[str, object]] = [
        {"attempt_id": pk, "reason": reason or "cancelled", "grace_seconds": grace}
        for pk, reason, grace in rows
    ]
    wanted = list(ended_ids)
    if wanted:
        ended = (
            JobAttempt.objects.filter(pk__in=wanted, state=AttemptState.ENDED, allocations__node_id=node_id)
            .values_list("pk", "outcome")
            .distinct()
        )
        for pk, outcome in ended:
            # withdrawn: ended while its node was silent, before it started (as if lost)
            reason = outcome if outcome in STOP_REASONS else "lost" if outcome == "withdrawn" else "cancelled"
            stops.append({"attempt_id": pk, "reason": reason, "grace_seconds": 0})
    return sorted(stops, key=lambda s: int(str(s["attempt_id"])))


def ingest_heartbeats(*, node: Node, items: Sequence[HeartbeatItem]) -> IngestResult:
    """Apply one node's heartbeat batch: one statement (autocommit) in the common case.

    Only when some items are rejected does it look further: a missing usage row is created and
    the item retried; an attempt the server already ended is added to the stop list.
    """
    merged = merge(items)
    accepted, stops = apply_usage(node_id=node.pk, items=merged, with_stops=True)
    missing = sorted({it.attempt_id for it in merged} - set(accepted))
    if missing and ensure_usage_rows(node_id=node.pk, attempt_ids=missing):
        # Rare: an attempt whose usage row was not created at start; retry just those items.
        retry = [it for it in merged if it.attempt_id in set(missing)]
        again, _ = apply_usage(node_id=node.pk, items=retry, touch_node=False)
        accepted = sorted(set(accepted) | set(again))
        missing = sorted({it.attempt_id for it in merged} - set(accepted))
    if missing:
        stops = stops_for_node(node_id=node.pk, ended_ids=missing)
    return IngestResult(accepted=accepted, rejected=missing, stop=stops)


def _apply_usage_portable(
    *, node_id: int, items: Sequence[HeartbeatItem], touch_node: bool, with_stops: bool
) -> tuple[list[int], list[dict[str, object]]]:
    """The same rules as HOT_SQL, row by row, for the embedded SQLite mode (one writer at a time,
    so the per-row ORM writes cannot race; PostgreSQL always takes the one-statement path)."""
    accepted: list[int] = []
    with transaction.atomic():
        now = db_now()
        if touch_node:
            Node.objects.filter(pk=node_id).update(last_heartbeat_at=now)
            mark_node_alive(node_id=node_id)  # only if it was unknown or down
        live = {
            attempt.pk: attempt
            for attempt in JobAttempt.objects.filter(
                pk__in=[it.attempt_id for it in items],
                state__in=(AttemptState.RUNNING, AttemptState.STOPPING),
                started_at__isnull=False,
                allocations__node_id=node_id,
                allocations__released_at__isnull=True,
            ).distinct()
        }
        shares = gang_shares(node_id=node_id, attempt_ids=list(live))
        usages = AttemptUsage.objects.filter(attempt_id__in=list(live), settled_at__isnull=True)
        for usage in usages:
            item = next(it for it in items if it.attempt_id == usage.attempt_id)
            attempt = live[usage.attempt_id]
            cap = billable_cap((now - attempt.started_at).total_seconds(), attempt.gpu_count)
            here, gang = shares[usage.attempt_id]
            reported = max(usage.reported_gpu_ms, min(MAX_BIGINT, item.cumulative_gpu_ms * gang // here))
            usage.billable_gpu_ms = max(usage.billable_gpu_ms, min(reported, cap))
            usage.reported_gpu_ms = reported
            if item.seq > usage.last_seq:
                usage.gpu_utilization = item.gpu_utilization
                usage.memory_used_mb = item.memory_used_mb
            usage.last_seq = max(usage.last_seq, item.seq)
            usage.last_heartbeat_at = now
            if attempt.node_count > 1:
                usage.part_reports = {**(usage.part_reports or {}), str(node_id): now.isoformat()}
            usage.save()
            accepted.append(usage.attempt_id)
    stops = stops_for_node(node_id=node_id) if with_stops else []
    return sorted(accepted), stops


def billable_cap(elapsed_seconds: float, gpu_count: int) -> int:
    """HOT_SQL's `cap` in Python: elapsed on the server's clock x GPUs x (1 + tolerance), plus the
    handshake slack per GPU (the embedded mode's heartbeats, and a gang's settlement)."""
    ratio = float(conf.value("METERING_CAP_TOLERANCE_RATIO"))
    slack = int(conf.seconds("METERING_CAP_SLACK_MS_PER_GPU"))
    return int(max(0.0, elapsed_seconds * 1000.0) * gpu_count * (1.0 + ratio)) + slack * gpu_count


def gang_shares(*, node_id: int, attempt_ids: list[int]) -> dict[int, tuple[int, int]]:
    """Attempt id -> (its live GPUs on this node, its live GPUs in all): HOT_SQL's `part`."""
    rows = (Allocation.objects.filter(attempt_id__in=attempt_ids, released_at__isnull=True)
            .values("attempt_id").annotate(here=Count("pk", filter=Q(node_id=node_id)), gang=Count("pk"))
            .values_list("attempt_id", "here", "gang"))
    return {attempt_id: (here, gang) for attempt_id, here, gang in rows}
