"""Appending many audit events at once (one scheduling pass writes thousands of decisions).

Same chain rules as `audit.services.record` (its `content_fields` and `audit.chain.event_digest`):
each chain head is locked once, events get consecutive seqs, and the rows go in with one
bulk INSERT. TODO(ledger engineer): this belongs in `audit.services` as `record_many`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from audit.chain import GENESIS, event_digest
from audit.models import AuditChainHead, AuditEvent
from audit.services import chain_for, content_fields
from config.clock import db_now
from config.request_context import current_request_id


@dataclass(frozen=True, slots=True)
class PendingEvent:
    """One audit event to append; the actor is always the scheduler."""

    action: str
    subject_type: str
    subject_id: int
    org_id: int | None
    reason_code: str
    data: dict[str, Any] = field(default_factory=dict)
    amount: int | None = None


def record_many(events: list[PendingEvent]) -> int:
    """Append `events` to their chains (call inside the transaction that made the changes)."""
    if not events:
        return 0
    by_chain: dict[str, list[PendingEvent]] = defaultdict(list)
    for event in events:
        by_chain[chain_for(event.org_id)].append(event)
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
    rows: list[AuditEvent] = []
    for chain in chains:
        head = heads[chain]
        seq, prev = head.seq, head.hash
        for pending in by_chain[chain]:
            seq += 1
            row = AuditEvent(
                created_at=now,
                org_id=pending.org_id,
                actor_type=AuditEvent.ActorType.SCHEDULER,
                actor_id="",
                action=pending.action,
                subject_type=pending.subject_type,
                subject_id=str(pending.subject_id),
                amount=pending.amount,
                reason_code=pending.reason_code,
                data=pending.data,
                request_id=request_id,
                chain=chain,
                seq=seq,
                prev_hash=prev,
            )
            row.hash = event_digest(prev_hash=prev, chain=chain, seq=seq, fields=content_fields(row))
            prev = row.hash
            rows.append(row)
        head.seq, head.hash = seq, prev
    AuditEvent.objects.bulk_create(rows, batch_size=2000)
    AuditChainHead.objects.bulk_update(list(heads.values()), ["seq", "hash"], batch_size=500)
    return len(rows)
