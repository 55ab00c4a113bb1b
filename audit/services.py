"""Writing audit events: same transaction as the change, appended to a hash chain."""

from typing import Any

from django.db import transaction

from audit.chain import GENESIS, event_digest
from audit.models import AuditChainHead, AuditEvent
from config.clock import db_now
from config.request_context import current_request_id


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


@transaction.atomic
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
) -> AuditEvent:
    """Append one event. Locks the chain head, so the chain never forks."""
    chain = chain_for(org_id)
    AuditChainHead.objects.bulk_create(
        [AuditChainHead(chain=chain, seq=0, hash=GENESIS)], ignore_conflicts=True
    )
    head = AuditChainHead.objects.select_for_update().get(chain=chain)
    event = AuditEvent(
        created_at=db_now(),
        org_id=org_id,
        actor_type=actor_type,
        actor_id=str(actor_id),
        action=action,
        subject_type=subject_type,
        subject_id=str(subject_id),
        amount=amount,
        reason_code=reason_code,
        data=data or {},
        request_id=current_request_id(),
        chain=chain,
        seq=head.seq + 1,
        prev_hash=head.hash,
    )
    event.hash = event_digest(
        prev_hash=head.hash, chain=chain, seq=event.seq, fields=content_fields(event)
    )
    event.save(force_insert=True)
    AuditChainHead.objects.filter(chain=chain).update(seq=event.seq, hash=event.hash)
    return event
