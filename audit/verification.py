"""Recomputing every audit hash chain (`verify_audit`)."""

from __future__ import annotations

from audit.chain import GENESIS, digest_for
from audit.models import AuditChainHead, AuditEvent
from audit.services import content_fields


def verify_chains() -> list[str]:
    """Every break found (gap, wrong predecessor, wrong hash, head mismatch); empty when intact."""
    problems: list[str] = []
    heads = {h.chain: h for h in AuditChainHead.objects.all()}
    last: dict[str, tuple[int, str]] = {}
    for event in AuditEvent.objects.order_by("chain", "seq").iterator(chunk_size=2000):
        seq, prev = last.get(event.chain, (0, GENESIS))
        where = f"chain {event.chain} seq {event.seq} (event {event.pk})"
        if event.seq != seq + 1:
            problems.append(f"{where}: expected seq {seq + 1}")
        if event.prev_hash != prev:
            problems.append(f"{where}: prev_hash does not match the previous event's hash")
        try:
            digest = digest_for(event.hash_format, prev_hash=event.prev_hash, chain=event.chain,
                                seq=event.seq, fields=content_fields(event))
        except ValueError:
            digest = None
        if digest != event.hash:
            problems.append(f"{where}: content does not match its hash")
        last[event.chain] = (event.seq, event.hash)
    for chain, (seq, digest) in last.items():
        head = heads.get(chain)
        if head is None or (head.seq, head.hash) != (seq, digest):
            problems.append(f"chain {chain}: head does not point at its last event (seq {seq})")
    for chain, head in heads.items():
        if chain not in last and head.seq != 0:
            problems.append(f"chain {chain}: head at seq {head.seq} but the chain has no events")
    return problems
