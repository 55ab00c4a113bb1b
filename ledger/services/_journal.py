"""Shared plumbing for ledger services: validation, spend order, journal writes, audit, replays."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import F

from audit.services import RESERVE_ONE_SQL, Reserved, chain_for, record
from config import metrics
from config.request_context import current_request_id
from ledger.errors import IdempotencyConflict, InvalidAmount, InvalidParameter, UnknownGpuType
from ledger.models import Account, Bucket, BucketKind, Hold, HoldLine, HoldState, LedgerTransaction, Posting

# A leg: (account, bucket id or None, signed amount).
Leg = tuple[str, int | None, int]


class LedgerInvariantBroken(RuntimeError):
    """A conditional UPDATE matched no row although we hold the lock: a bug, never user input."""


def check_amount(amount: object, *, what: str = "amount") -> int:
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise InvalidAmount(f"The {what} must be a positive integer of micro-credits, got {amount!r}.")
    return amount


def check_gpu_types(names: Iterable[str]) -> list[str]:
    """Normalise (sorted, unique) and check GPU type names against the fleet's GpuType table."""
    from scheduling.models import GpuType

    wanted = sorted(set(names))
    if not wanted:
        return []
    if any(not isinstance(n, str) for n in wanted):
        raise InvalidParameter("GPU types must be names (strings).")
    known = set(GpuType.objects.filter(name__in=wanted).values_list("name", flat=True))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise UnknownGpuType(unknown)
    return wanted


def check_project(org_id: int, project: Any) -> int | None:
    if project is None:
        return None
    if project.org_id != org_id:
        raise InvalidParameter("The project belongs to another organization.")
    return int(project.pk)


def spend_order_key(bucket: Bucket) -> tuple[Any, ...]:
    """DESIGN.md §2: expires_at (nulls last), promotional before paid, effective_at, id."""
    return (
        bucket.expires_at is None,
        bucket.expires_at or datetime.max,
        bucket.kind != BucketKind.PROMOTIONAL,
        bucket.effective_at,
        bucket.pk,
    )


def is_expired(bucket: Bucket, now: datetime) -> bool:
    return bucket.expires_at is not None and bucket.expires_at <= now


def actor_fields(actor: Any) -> tuple[str, str]:
    """`None` -> system; "scheduler" or "agent:12" -> that type/id; a user object -> ("user", pk)."""
    if actor is None:
        return "system", ""
    if isinstance(actor, str):
        kind, _, ident = actor.partition(":")
        return kind, ident
    return "user", str(actor.pk)


def acting_user(actor: Any) -> Any:
    """The user who acts, for a `created_by` column; None for the system or a named service."""
    return None if actor is None or isinstance(actor, str) else actor


def replay(*, org_id: int, key: str, kind: str, params: dict[str, Any]) -> LedgerTransaction | None:
    """The transaction already recorded under `key`, if any; a different request is a conflict."""
    existing = LedgerTransaction.objects.filter(org_id=org_id, key=key).first()
    if existing is None:
        return None
    if existing.kind != kind or existing.params != params:
        raise IdempotencyConflict(
            f"Key {key!r} was already used for a different {existing.kind} request.",
            key=key,
            original=existing.params,
        )
    return existing


def post_transaction(
    *,
    org_id: int,
    kind: str,
    key: str,
    legs: Sequence[Leg],
    now: datetime,
    params: dict[str, Any],
    hold: Hold | None = None,
    memo: str = "",
) -> LedgerTransaction:
    """Write one balanced transaction (legs on the same account/bucket are merged)."""
    merged: dict[tuple[str, int | None], int] = defaultdict(int)
    for account, bucket_id, amount in legs:
        merged[(account, bucket_id)] += amount
    if sum(merged.values()) != 0:
        raise LedgerInvariantBroken(f"unbalanced {kind} transaction: {dict(merged)}")
    txn = LedgerTransaction.objects.create(
        org_id=org_id,
        kind=kind,
        key=key,
        hold=hold,
        created_at=now,
        memo=memo,
        amount=sum(a for a in merged.values() if a > 0),
        params=params,
        request_id=current_request_id(),
    )
    Posting.objects.bulk_create(
        Posting(transaction=txn, org_id=org_id, account=account, bucket_id=bucket_id, amount=amount)
        for (account, bucket_id), amount in merged.items()
        if amount != 0
    )
    return txn


def move_bucket(bucket_id: int, *, source: str, target: str, amount: int) -> None:
    """Conditional UPDATE of a locked bucket's cached columns: `amount` from one column to another."""
    updated = Bucket.objects.filter(pk=bucket_id, **{f"{source}__gte": amount}).update(
        **{source: F(source) - amount, target: F(target) + amount}
    )
    if updated != 1:
        raise LedgerInvariantBroken(f"bucket {bucket_id}: {source} below {amount} under lock")


def audit(
    *,
    txn: LedgerTransaction,
    subject_type: str,
    subject_id: int,
    actor: Any,
    reason: str = "",
    reason_code: str = "",
    data: dict[str, Any] | None = None,
    reserved: Reserved | None = None,
) -> None:
    actor_type, actor_id = actor_fields(actor)
    record(
        reserved=reserved,
        action=f"ledger.{txn.kind}",
        subject_type=subject_type,
        subject_id=subject_id,
        org_id=txn.org_id,
        actor_type=actor_type,
        actor_id=actor_id,
        amount=txn.amount,
        reason_code=reason_code or txn.kind,
        data={"transaction": txn.pk, "key": txn.key, "reason": reason, **(data or {})},
    )


@dataclass(frozen=True, slots=True)
class CallerEvent:
    """A caller's own audit event that also records a ledger movement (one event, not two).

    The ledger adds the movement's facts to `data` (transaction id, key, buckets …) and its
    amount; used by job submission so a submission appends one event to the org's chain.
    """

    action: str
    subject_type: str
    subject_id: str | int
    reason_code: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def audit_as_caller(
    *, txn: LedgerTransaction, event: CallerEvent, actor: Any, data: dict[str, Any],
    reserved: Reserved | None = None,
) -> None:
    actor_type, actor_id = actor_fields(actor)
    record(
        reserved=reserved,
        action=event.action,
        subject_type=event.subject_type,
        subject_id=event.subject_id,
        org_id=txn.org_id,
        actor_type=actor_type,
        actor_id=actor_id,
        amount=txn.amount,
        reason_code=event.reason_code or txn.kind,
        data={**event.data, "transaction": txn.pk, "key": txn.key, "ledger": f"ledger.{txn.kind}",
              **data},
    )


AVAILABLE = Account.BUCKET_AVAILABLE
HELD = Account.BUCKET_HELD


# --- One-statement writes (PostgreSQL) -----------------------------------------------------------
#
# A ledger operation decides in Python under its locks, then writes everything it decided --
# bucket columns, hold lines, the hold, the journal transaction and its postings -- in one
# statement of data-modifying CTEs (one round trip instead of one per row). Bucket updates stay
# conditional (no column may go below zero); a short row count raises LedgerInvariantBroken,
# which rolls the whole operation back. Other databases (the embedded SQLite mode) get the same
# writes one ORM query at a time.

BUCKET_COLUMNS = ("available", "held", "spent", "expired", "voided")
LINE_COLUMNS = ("authorized", "captured", "released")


@dataclass(slots=True)
class Movement:
    """Everything one ledger operation writes, decided under its locks."""

    org_id: int
    kind: str
    key: str
    now: datetime
    params: dict[str, Any]
    legs: list[Leg] = field(default_factory=list)
    hold: Hold | None = None
    memo: str = ""
    # bucket id -> {column: signed delta}
    buckets: dict[int, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    # hold line id -> {column: signed delta}
    lines: dict[int, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    new_lines: list[tuple[int, int]] = field(default_factory=list)  # (bucket id, authorized)
    hold_deltas: dict[str, int] = field(default_factory=dict)
    settle: bool = False
    # Set by write_movement(reserve_audit=True): the org's audit chain head, locked and bumped by
    # the write statement itself (the operation's last lock), for `audit(reserved=…)`.
    audit_head: Reserved | None = None

    def move(self, bucket_id: int, *, source: str, target: str, amount: int) -> None:
        cols = self.buckets[bucket_id]
        cols[source] = cols.get(source, 0) - amount
        cols[target] = cols.get(target, 0) + amount

    def line(self, line_id: int, column: str, amount: int) -> None:
        cols = self.lines[line_id]
        cols[column] = cols.get(column, 0) + amount


def _merged_legs(m: Movement) -> dict[tuple[str, int | None], int]:
    merged: dict[tuple[str, int | None], int] = defaultdict(int)
    for account, bucket_id, amount in m.legs:
        merged[(account, bucket_id)] += amount
    if sum(merged.values()) != 0:
        raise LedgerInvariantBroken(f"unbalanced {m.kind} transaction: {dict(merged)}")
    return {k: v for k, v in merged.items() if v != 0}


def write_movement(m: Movement, *, reserve_audit: bool = False) -> LedgerTransaction:
    """Write `m` (the caller holds the hold and bucket locks it decided under).

    `reserve_audit`: also lock and bump the org's audit chain head in the same statement
    (`m.audit_head`, None if the chain has no head yet); the caller must then append exactly one
    event to that chain with `audit(reserved=m.audit_head)` in this transaction.
    """
    return write_movements([m], reserve_audit=reserve_audit)[0]


def write_movements(movements: Sequence[Movement], *, reserve_audit: bool = False) -> list[LedgerTransaction]:
    """Write several movements (each its own journal transaction) in one statement on PostgreSQL.

    The caller holds every hold and bucket lock the movements were decided under.
    """
    if reserve_audit and len(movements) != 1:
        raise ValueError("reserve_audit is for a single movement")
    prepared = []
    for m in movements:
        merged = _merged_legs(m)
        txn = LedgerTransaction(
            org_id=m.org_id, kind=m.kind, key=m.key, hold=m.hold, created_at=m.now, memo=m.memo,
            amount=sum(a for a in merged.values() if a > 0), params=m.params,
            request_id=current_request_id(),
        )
        prepared.append((m, txn, merged))
    if not prepared:
        return []
    if connection.vendor != "postgresql":
        for m, txn, merged in prepared:
            _write_orm(m, txn, merged)
    else:
        _write_sql(prepared, audit_chain=chain_for(movements[0].org_id) if reserve_audit else None)
    for m, txn, _ in prepared:
        metrics.ledger_movement(kind=m.kind, amount=txn.amount, settled=m.settle)  # on commit
        if m.hold is not None:
            for column, delta in m.hold_deltas.items():
                setattr(m.hold, column, getattr(m.hold, column) + delta)
            if m.settle:
                m.hold.state, m.hold.settled_at = HoldState.SETTLED, m.now
    return [txn for _, txn, _ in prepared]


# Every value travels in ONE json parameter (`d`), unpacked by json_to_recordset: dumping a few
# dozen array parameters cost more Python CPU than the statement itself. The hold states are
# constants of the code, not values.
_WRITE_SQL = f"""
WITH d AS (SELECT %s::json AS j), b AS (
    UPDATE {Bucket._meta.db_table} AS t SET
        available = t.available + v.a, held = t.held + v.h, spent = t.spent + v.s,
        expired = t.expired + v.e, voided = t.voided + v.v
    FROM json_to_recordset((SELECT j->'b' FROM d)) AS v(id bigint, a bigint, h bigint, s bigint,
                                                         e bigint, v bigint)
    WHERE t.id = v.id AND t.available + v.a >= 0 AND t.held + v.h >= 0 AND t.spent + v.s >= 0
        AND t.expired + v.e >= 0 AND t.voided + v.v >= 0
    RETURNING t.id
), l AS (
    UPDATE {HoldLine._meta.db_table} AS t SET
        authorized = t.authorized + v.a, captured = t.captured + v.c, released = t.released + v.r
    FROM json_to_recordset((SELECT j->'l' FROM d)) AS v(id bigint, a bigint, c bigint, r bigint)
    WHERE t.id = v.id
    RETURNING t.id
), nl AS (
    INSERT INTO {HoldLine._meta.db_table} (hold_id, bucket_id, authorized, captured, released)
    SELECT v.hold, v.b, v.a, 0, 0
    FROM json_to_recordset((SELECT j->'nl' FROM d)) AS v(hold bigint, b bigint, a bigint)
    RETURNING id
), h AS (
    UPDATE {Hold._meta.db_table} AS t SET
        authorized = t.authorized + v.a, captured = t.captured + v.c, released = t.released + v.r,
        state = CASE WHEN v.settle THEN '{HoldState.SETTLED}' ELSE t.state END,
        settled_at = CASE WHEN v.settle THEN v.at ELSE t.settled_at END
    FROM json_to_recordset((SELECT j->'h' FROM d))
        AS v(id bigint, a bigint, c bigint, r bigint, settle boolean, at timestamptz)
    WHERE t.id = v.id AND (NOT v.settle OR t.state = '{HoldState.ACTIVE}')
    RETURNING t.id
), x AS (
    INSERT INTO {LedgerTransaction._meta.db_table}
        (org_id, kind, key, hold_id, created_at, memo, amount, params, request_id)
    SELECT v.org, v.kind, v.key, v.hold, v.at, v.memo, v.amount, v.params, v.rid
    FROM json_to_recordset((SELECT j->'x' FROM d))
        AS v(org bigint, kind text, key text, hold bigint, at timestamptz, memo text,
             amount bigint, params jsonb, rid text)
    RETURNING id, org_id, key
), p AS (
    INSERT INTO {Posting._meta.db_table} (transaction_id, org_id, account, bucket_id, amount)
    SELECT x.id, v.org, v.account, v.bucket, v.amount
    FROM json_to_recordset((SELECT j->'p' FROM d))
        AS v(n int, org bigint, key text, account text, bucket bigint, amount bigint)
    JOIN x ON x.org_id = v.org AND x.key = v.key
    ORDER BY v.n  -- posting ids in the legs' order, whatever join the planner picks
    RETURNING id
), ah AS (
    {RESERVE_ONE_SQL}
)
SELECT x.id, x.org_id, x.key, (SELECT count(*) FROM b), (SELECT count(*) FROM l),
       (SELECT count(*) FROM nl), (SELECT count(*) FROM h), (SELECT count(*) FROM p),
       (SELECT seq FROM ah), (SELECT hash FROM ah), (SELECT clock FROM ah)
FROM x
"""  # noqa: S608 -- table names and the code's own state constants only; values are parameters

assert all(c.isalnum() or c == "_" for c in HoldState.SETTLED + HoldState.ACTIVE)


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON-serializable in a ledger write: {type(value).__name__}")


def _write_sql(
    prepared: list[tuple[Movement, LedgerTransaction, dict[tuple[str, int | None], int]]],
    *, audit_chain: str | None,
) -> None:
    buckets: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    lines: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    holds: dict[int, dict[str, Any]] = {}
    new_lines: list[dict[str, int]] = []
    for m, _, _ in prepared:
        for bucket_id, cols in m.buckets.items():
            for c, d in cols.items():
                buckets[bucket_id][c] += d
        for line_id, cols in m.lines.items():
            for c, d in cols.items():
                lines[line_id][c] += d
        if m.hold is not None:
            hold_id = m.hold.pk
            new_lines += [{"hold": hold_id, "b": b, "a": a} for b, a in m.new_lines]
            if m.hold_deltas or m.settle:
                entry = holds.setdefault(hold_id, {"settle": False, "at": m.now})
                for c, d in m.hold_deltas.items():
                    entry[c] = entry.get(c, 0) + d
                if m.settle:
                    entry["settle"], entry["at"] = True, m.now
    postings = [
        {"org": m.org_id, "key": m.key, "account": account, "bucket": bucket_id, "amount": amount}
        for m, _, merged in prepared for (account, bucket_id), amount in merged.items()
    ]
    for n, posting in enumerate(postings):
        posting["n"] = n
    doc = {
        "b": [{"id": b, "a": cols["available"], "h": cols["held"], "s": cols["spent"],
               "e": cols["expired"], "v": cols["voided"]} for b, cols in sorted(buckets.items())],
        "l": [{"id": ln, "a": cols["authorized"], "c": cols["captured"], "r": cols["released"]}
              for ln, cols in sorted(lines.items())],
        "nl": new_lines,
        "h": [{"id": h, "a": e.get("authorized", 0), "c": e.get("captured", 0),
               "r": e.get("released", 0), "settle": e["settle"], "at": e["at"]}
              for h, e in sorted(holds.items())],
        "x": [{"org": t.org_id, "kind": t.kind, "key": t.key, "hold": t.hold_id, "at": t.created_at,
               "memo": t.memo, "amount": t.amount, "params": t.params, "rid": t.request_id}
              for _, t, _ in prepared],
        "p": postings,
    }
    with connection.cursor() as cursor:
        # audit_chain NULL matches no head: nothing reserved
        cursor.execute(_WRITE_SQL, [json.dumps(doc, default=_iso), audit_chain])
        rows = cursor.fetchall()
    ids = {(org_id, key): txn_id for txn_id, org_id, key, *_ in rows}
    counts = tuple(rows[0][3:8]) if rows else (0, 0, 0, 0, 0)
    wanted = (len(buckets), len(lines), len(new_lines), len(holds), len(postings))
    if len(ids) != len(prepared) or counts != wanted:
        raise LedgerInvariantBroken(
            f"ledger write under lock: wrote {counts} of {wanted} (buckets, lines, new lines, holds, "
            f"postings) for {len(ids)} of {len(prepared)} transactions"
        )
    for _, txn, _ in prepared:
        txn.pk = ids[(txn.org_id, txn.key)]
        txn._state.adding = False
        txn._state.db = connection.alias
    if audit_chain is not None and rows and rows[0][8] is not None:
        prepared[0][0].audit_head = (rows[0][8], rows[0][9], rows[0][10])


def _write_orm(m: Movement, txn: LedgerTransaction, merged: dict[tuple[str, int | None], int]) -> None:
    for bucket_id, cols in sorted(m.buckets.items()):
        conditions = {f"{c}__gte": -d for c, d in cols.items() if d < 0}
        updated = Bucket.objects.filter(pk=bucket_id, **conditions).update(
            **{c: F(c) + d for c, d in cols.items() if d}
        )
        if updated != 1:
            raise LedgerInvariantBroken(f"bucket {bucket_id}: cannot apply {cols} under lock")
    for line_id, cols in sorted(m.lines.items()):
        HoldLine.objects.filter(pk=line_id).update(**{c: F(c) + d for c, d in cols.items()})
    if m.new_lines:
        HoldLine.objects.bulk_create(
            HoldLine(hold=m.hold, bucket_id=b, authorized=a) for b, a in m.new_lines
        )
    if m.hold is not None and (m.hold_deltas or m.settle):
        changes: dict[str, Any] = {c: F(c) + d for c, d in m.hold_deltas.items()}
        if m.settle:
            changes.update(state=HoldState.SETTLED, settled_at=m.now)
        Hold.objects.filter(pk=m.hold.pk, state=HoldState.ACTIVE).update(**changes)
    txn.save(force_insert=True)
    Posting.objects.bulk_create(
        Posting(transaction=txn, org_id=m.org_id, account=a, bucket_id=b, amount=v)
        for (a, b), v in merged.items()
    )
