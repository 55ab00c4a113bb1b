"""Ledger services: the only way to move credits (docs/interfaces.md, docs/ledger.md).

Every service is keyword-only, one `transaction.atomic()`, takes locks through `ledger.locks`
(hold -> buckets by id), decides after re-reading, writes with conditional UPDATEs and a balanced
journal transaction plus its audit event, and is retried on 40001/40P01 when it is outermost.
"""

from ledger.services._journal import CallerEvent
from ledger.services.expiry import expire_due_buckets
from ledger.services.holds import extend_hold, place_hold
from ledger.services.issuance import issue_credits, issue_refund, void_credits
from ledger.services.settlement import (
    capture,
    release_hold,
    release_partial,
    release_partial_many,
    settle_hold,
)

__all__ = [
    "CallerEvent",
    "capture",
    "expire_due_buckets",
    "extend_hold",
    "issue_credits",
    "issue_refund",
    "place_hold",
    "release_hold",
    "release_partial",
    "release_partial_many",
    "settle_hold",
    "void_credits",
]
