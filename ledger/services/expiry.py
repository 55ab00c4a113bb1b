"""Expiring buckets: their available part now, their held part as it is released."""

from __future__ import annotations

from django.db import transaction

from ledger.clock import ledger_now
from ledger.locks import claim_buckets
from ledger.models import Account, Bucket, TransactionKind
from ledger.retry import retry_on_conflict
from ledger.services._journal import AVAILABLE, audit, move_bucket, post_transaction


@retry_on_conflict()
@transaction.atomic
def expire_due_buckets(*, limit: int = 500) -> int:
    """Expire up to `limit` due buckets; returns how many. Safe in parallel (SKIP LOCKED).

    A bucket another transaction has locked (a hold being placed on it) is skipped and picked
    up by the next run; the hold could not draw on it anyway, since holds only use unexpired
    buckets. Idempotent by bucket state: an expired bucket has nothing available left.
    """
    now = ledger_now()
    due = Bucket.objects.filter(expires_at__lte=now, available__gt=0)
    buckets = claim_buckets(due, limit)
    # Audit chain heads (one per org) are locked after the buckets; taking them in org order
    # keeps two parallel expiry runs from waiting on each other's heads in opposite orders.
    for bucket in sorted(buckets, key=lambda b: (b.org_id, b.pk)):
        amount = bucket.available
        move_bucket(bucket.pk, source="available", target="expired", amount=amount)
        txn = post_transaction(
            org_id=bucket.org_id,
            kind=TransactionKind.EXPIRE,
            # Keyed by what had expired before (read under the lock): later releases expire inside
            # `release`, so a bucket's available part expires once; should credits ever be back
            # in it, they expire too instead of failing the whole batch on a reused key (review).
            key=f"expire:{bucket.pk}:{bucket.expired}",
            legs=[(AVAILABLE, bucket.pk, -amount), (Account.EXPIRY, None, amount)],
            now=now,
            params={"bucket": bucket.pk},
        )
        audit(txn=txn, subject_type="ledger.bucket", subject_id=bucket.pk, actor=None, reason_code="expired")
    return len(buckets)
