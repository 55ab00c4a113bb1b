"""Rebuilding bucket balances from the journal (for `verify_ledger` and balances as of a past time).

The bucket columns are a cache; this is the truth. Per bucket, the postings on its two accounts
grouped by transaction kind give every column back:
granted = +available in issue and refund; voided = -available in void; spent = -held in capture;
expired = -available in expire, plus whatever a release took off `held` without putting it
back on `available` (the part released after the bucket's expiry).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import Sum

from ledger.models import Account, Posting, TransactionKind

COLUMNS = ("granted", "available", "held", "spent", "expired", "voided")


def bucket_columns_from_postings(
    *, org_id: int | None = None, bucket_ids: list[int] | None = None, as_of: datetime | None = None
) -> dict[int, dict[str, int]]:
    """Every bucket's columns recomputed from postings (up to `as_of`, inclusive, if given)."""
    qs = Posting.objects.filter(bucket__isnull=False)
    if org_id is not None:
        qs = qs.filter(org_id=org_id)
    if bucket_ids is not None:
        qs = qs.filter(bucket_id__in=bucket_ids)
    if as_of is not None:
        qs = qs.filter(transaction__created_at__lte=as_of)
    sums: dict[int, dict[tuple[str, str], int]] = defaultdict(dict)
    rows = qs.values_list("bucket_id", "transaction__kind", "account").annotate(total=Sum("amount"))
    for bucket_id, kind, account, total in rows:
        sums[bucket_id][(kind, account)] = int(total)
    return {bucket_id: _columns(parts) for bucket_id, parts in sums.items()}


def _columns(parts: dict[tuple[str, str], int]) -> dict[str, int]:
    def get(kind: str, account: str) -> int:
        return parts.get((kind, account), 0)

    avail, held = Account.BUCKET_AVAILABLE, Account.BUCKET_HELD
    K = TransactionKind
    released_off_held = -get(K.RELEASE, held)
    return {
        "granted": get(K.ISSUE, avail) + get(K.REFUND, avail),
        "available": sum(v for (_, acc), v in parts.items() if acc == avail),
        "held": sum(v for (_, acc), v in parts.items() if acc == held),
        "spent": -get(K.CAPTURE, held),
        "expired": -get(K.EXPIRE, avail) + released_off_held - get(K.RELEASE, avail),
        "voided": -get(K.VOID, avail),
    }


def project_usage_from_postings(*, org_id: int, project_id: int, as_of: datetime) -> dict[str, int]:
    """What the holds of one project held and had spent at `as_of` (inclusive), from the postings.

    Only the `bucket_held` legs of transactions on the project's holds count: every place and
    extend adds to held, every capture and release takes off it, so their sum is what was still
    held, and the captures alone are what was spent.
    """
    rows = (
        Posting.objects.filter(
            org_id=org_id,
            account=Account.BUCKET_HELD,
            transaction__hold__project_id=project_id,
            transaction__created_at__lte=as_of,
        )
        .values_list("transaction__kind")
        .annotate(total=Sum("amount"))
    )
    parts = {kind: int(total) for kind, total in rows}
    return {"held": sum(parts.values()), "spent": -parts.get(TransactionKind.CAPTURE, 0)}
