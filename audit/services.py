"""Writing audit events: same transaction as the change, appended to a hash chain.

On PostgreSQL one event costs two statements: an `UPDATE … RETURNING` of the chain head that
locks it, advances its seq and reads the transaction clock in one round trip, then one statement
that inserts the event and moves the head's hash. `record_many` appends a batch with one head
lock per chain (heads locked in chain-name order, so two batch writers cannot deadlock).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from audit.chain import GENESIS, event_digest
from audit.models import AuditChainHead, AuditEvent
from config.clock import db_now
from config.request_context import current_request_id

_EVENT = AuditEvent._meta.db_table
_HEAD = AuditChainHead._meta.db_table


def chain_for(org_id: int | None) -> str:
    # One chain per organization keeps appends from serializing unrelated tenants.
    return f"org:{org_id}" if org_id is not None else "system"


def content_fields(event: AuditEvent) -> dict[str, Any]:
    """The fields the hash commits to (shared with verification)."""
    return {
        "created_at": event.created_at,
        "org_id": event.org_id,
        "actor_type": event.actor_type,
        "actor_id": event.actor_id,
        "action": event.action,
        "subject_type": event.subject_type,
        "subject_id": event.subject_id,
        "amount": event.amount,
        "reason_code": event.reason_code,
        "data": event.data,
        "request_id": event.request_id,
    }


@dataclass(frozen=True, slots=True)
class NewEvent:
    """One event to append with `record_many` (same fields as `record`)."""

    action: str
    subject_type: str
    subject_id: str | int
    org_id: int | None = None
    actor_type: str = AuditEvent.ActorType.SYSTEM
    actor_id: str | int = ""
    amount: int | None = None
    reason_code: str = ""
    data: dict[str, Any] = field(default_factory=dict)


# For callers that fold the head reservation into their own write statement (as a CTE, after
# every other lock of the operation): reserves one seq; RETURNING (seq after, hash before, clock).
RESERVE_ONE_SQL = f"UPDATE {_HEAD} SET seq = seq + 1 WHERE chain = %s RETURNING seq, hash, now() AS clock"  # noqa: S608

# A head reserved by RESERVE_ONE_SQL in the caller's statement: (seq after the bump, hash, clock).
Reserved = tuple[int, str, datetime]


def _advance_head(chain: str, count: int) -> tuple[int, str, datetime]:
    """Lock the chain head and reserve `count` seqs: (seq before, hash before, DB clock)."""
    sql = f"UPDATE {_HEAD} SET seq = seq + %s WHERE chain = %s RETURNING seq, hash, now()"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, [count, chain])
        row = cursor.fetchone()
        if row is None:  # first event of this chain
            cursor.execute(
                f"INSERT INTO {_HEAD} (chain, seq, hash) VALUES (%s, 0, %s) ON CONFLICT DO NOTHING",  # noqa: S608
                [chain, GENESIS],
            )
            cursor.execute(sql, [count, chain])
            row = cursor.fetchone()
    seq, prev, now = row
    return seq - count, prev, now


def _insert_and_move_head(event: AuditEvent) -> None:
    """Insert the event and point its chain head at it, in one statement."""
    sql = (
        f"WITH e AS (INSERT INTO {_EVENT} (created_at, org_id, actor_type, actor_id, action, "  # noqa: S608
        "subject_type, subject_id, amount, reason_code, data, request_id, chain, seq, prev_hash, hash) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s) RETURNING id) "
        f"UPDATE {_HEAD} SET hash = %s WHERE chain = %s AND seq = %s RETURNING (SELECT id FROM e)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [
            event.created_at, event.org_id, event.actor_type, event.actor_id, event.action,
            event.subject_type, event.subject_id, event.amount, event.reason_code,
            json.dumps(event.data), event.request_id, event.chain, event.seq, event.prev_hash,
            event.hash, event.hash, event.chain, event.seq,
        ])
        row = cursor.fetchone()
    if row is None:  # impossible under the head lock; never leave a head behind its chain
        raise RuntimeError(f"audit chain {event.chain}: head moved while locked")
    event.pk = row[0]
    event._state.adding = False
    event._state.db = connection.alias


def _build(spec: NewEvent, *, chain: str, seq: int, prev: str, now: datetime, request_id: str) -> AuditEvent:
    event = AuditEvent(
        created_at=now,
        org_id=spec.org_id,
        actor_type=spec.actor_type,
        actor_id=str(spec.actor_id),
        action=spec.action,
        subject_type=spec.subject_type,
        subject_id=str(spec.subject_id),
        amount=spec.amount,
        reason_code=spec.reason_code,
        data=spec.data or {},
        request_id=request_id,
        chain=chain,
        seq=seq,
        prev_hash=prev,
    )
    event.hash = event_digest(prev_hash=prev, chain=chain, seq=seq, fields=content_fields(event))
    return event


@transaction.atomic(savepoint=False)
def record(
    *,
    action: str,
    subject_type: str,
    subject_id: str | int,
    org_id: int | None = None,
    actor_type: str = AuditEvent.ActorType.SYSTEM,
    actor_id: str | int = "",
    amount: int | None = None,
    reason_code: str = "",
    data: dict[str, Any] | None = None,
    reserved: Reserved | None = None,
) -> AuditEvent:
    """Append one event. Locks the chain head, so the chain never forks.

    `reserved`: the chain head was already locked and its seq bumped by one with
    `RESERVE_ONE_SQL` in this transaction (the caller's last lock); saves a round trip.
    """
    spec = NewEvent(
        action=action, subject_type=subject_type, subject_id=subject_id, org_id=org_id,
        actor_type=actor_type, actor_id=actor_id, amount=amount, reason_code=reason_code,
        data=data or {},
    )
    chain = chain_for(org_id)
    if connection.vendor != "postgresql":
        # Embedded SQLite: the whole database is locked by the transaction anyway.
        record_many([spec])
        return AuditEvent.objects.filter(chain=chain).order_by("-seq").first()  # type: ignore[return-value]
    if reserved is not None:
        seq, prev, now = reserved[0] - 1, reserved[1], reserved[2]
    else:
        seq, prev, now = _advance_head(chain, 1)
    event = _build(spec, chain=chain, seq=seq + 1, prev=prev, now=now, request_id=current_request_id())
    _insert_and_move_head(event)
    return event


_COLUMNS = (
    "created_at", "org_id", "actor_type", "actor_id", "action", "subject_type", "subject_id",
    "amount", "reason_code", "data", "request_id", "chain", "seq", "prev_hash", "hash",
)
_TYPES = {"created_at": "timestamptz", "org_id": "bigint", "amount": "bigint", "seq": "bigint",
          "data": "jsonb"}
_BULK_SQL = (
    f"INSERT INTO {_EVENT} ({', '.join(_COLUMNS)}) SELECT {', '.join(_COLUMNS)} "  # noqa: S608
    "FROM json_to_recordset(%s::json) AS v("
    + ", ".join(f"{c} {_TYPES.get(c, 'text')}" for c in _COLUMNS)
    + ")"
)


@transaction.atomic(savepoint=False)
def record_many(events: Sequence[NewEvent]) -> int:
    """Append `events` (in order within each chain) with one head lock per chain and one bulk
    insert; returns how many. Same chain rules as `record`; call it inside the transaction that
    made the changes. (Rows are built as plain dicts: model instances cost more than the SQL.)"""
    if not events:
        return 0
    by_chain: dict[str, list[NewEvent]] = defaultdict(list)
    for spec in events:
        by_chain[chain_for(spec.org_id)].append(spec)
    chains = sorted(by_chain)
    AuditChainHead.objects.bulk_create(
        [AuditChainHead(chain=c, seq=0, hash=GENESIS) for c in chains], ignore_conflicts=True
    )
    # Lock heads in name order so two batch writers can never deadlock each other.
    heads = {
        h.chain: h
        for h in AuditChainHead.objects.select_for_update().filter(chain__in=chains).order_by("chain")
    }
    now = db_now()
    request_id = current_request_id()
    rows: list[dict[str, Any]] = []
    for chain in chains:
        head = heads[chain]
        seq, prev = head.seq, head.hash
        for spec in by_chain[chain]:
            seq += 1
            fields = {
                "created_at": now, "org_id": spec.org_id, "actor_type": spec.actor_type,
                "actor_id": str(spec.actor_id), "action": spec.action,
                "subject_type": spec.subject_type, "subject_id": str(spec.subject_id),
                "amount": spec.amount, "reason_code": spec.reason_code, "data": spec.data or {},
                "request_id": request_id,
            }
            digest = event_digest(prev_hash=prev, chain=chain, seq=seq, fields=fields)
            rows.append({**fields, "chain": chain, "seq": seq, "prev_hash": prev, "hash": digest})
            prev = digest
        head.seq, head.hash = seq, prev
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_BULK_SQL, [json.dumps(rows, default=_iso)])
            if len(heads) > 1:
                cursor.execute(
                    f"UPDATE {_HEAD} AS h SET seq = v.seq, hash = v.hash "  # noqa: S608
                    "FROM unnest(%s::text[], %s::bigint[], %s::text[]) AS v(chain, seq, hash) "
                    "WHERE h.chain = v.chain",
                    [list(heads), [h.seq for h in heads.values()], [h.hash for h in heads.values()]],
                )
            else:
                (head,) = heads.values()
                cursor.execute(
                    f"UPDATE {_HEAD} SET seq = %s, hash = %s WHERE chain = %s",  # noqa: S608
                    [head.seq, head.hash, head.chain],
                )
        return len(rows)
    AuditEvent.objects.bulk_create([AuditEvent(**row) for row in rows], batch_size=2000)
    for head in heads.values():
        AuditChainHead.objects.filter(chain=head.chain).update(seq=head.seq, hash=head.hash)
    return len(rows)


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON-serializable in an audit event: {type(value).__name__}")
