"""Reads of the ledger: balance breakdowns (now or as of a past time), an org's journal, and what a
hold's releases became (back to the org or to expiry)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce

from accounts.models import Organization, Project
from ledger.clock import ledger_now
from ledger.journal import COLUMNS, bucket_columns_from_postings, project_usage_from_postings
from ledger.models import Account, Bucket, BucketKind, Hold, LedgerTransaction, Posting, TransactionKind
from ledger.services._journal import spend_order_key

EXPIRY_HORIZONS = {"7d": timedelta(days=7), "30d": timedelta(days=30)}


def _closed_by(bucket: Bucket, at: datetime) -> bool:
    return bucket.closed_at is not None and bucket.closed_at <= at


def expires_at_as_of(bucket: Bucket, at: datetime) -> datetime | None:
    """The bucket's expiry as it stood at `at`: before finance closed it, the one it had then."""
    if bucket.closed_at is not None and not _closed_by(bucket, at):
        return bucket.expires_at_before_close
    return bucket.expires_at


def _status(bucket: Bucket, at: datetime) -> str:
    if bucket.effective_at > at:
        return "not_yet_effective"
    expires_at = expires_at_as_of(bucket, at)
    if expires_at is not None and expires_at <= at:
        return "expired"
    return "active"


def balance_breakdown(
    *, org: Organization, project: Project | None = None, as_of: datetime | None = None
) -> dict[str, Any]:
    """Available/held/spent/expired/voided, paid vs promotional, upcoming expiries, per bucket.

    With a project: the buckets that project can spend (its own and the org-wide ones). Their
    totals are the buckets' (the org's other projects hold and spend org-wide buckets too), so the
    project's own holds are added apart as `project_usage` (None for a whole org). Without
    `as_of` the bucket columns are read; with it, every figure is recomputed from the postings
    up to that instant. `spendable` is what a hold could draw on at that time (active buckets).
    """
    at = as_of or ledger_now()
    buckets_qs = Bucket.objects.filter(org=org)
    if project is not None:
        buckets_qs = buckets_qs.filter(Q(project__isnull=True) | Q(project=project))
    buckets = sorted(buckets_qs, key=spend_order_key)
    if as_of is not None:
        rebuilt = bucket_columns_from_postings(org_id=org.pk, bucket_ids=[b.pk for b in buckets], as_of=as_of)
        buckets = [b for b in buckets if b.pk in rebuilt]
        columns = {b.pk: rebuilt[b.pk] for b in buckets}
    else:
        columns = {b.pk: {c: getattr(b, c) for c in COLUMNS} for b in buckets}

    names = (*COLUMNS, "spendable")
    totals: dict[str, int] = dict.fromkeys(names, 0)
    by_kind: dict[str, dict[str, int]] = {k: dict.fromkeys(names, 0) for k in BucketKind.values}
    expiring: dict[str, int] = dict.fromkeys(EXPIRY_HORIZONS, 0)
    rows = []
    for bucket in buckets:
        cols = columns[bucket.pk]
        status, expires_at = _status(bucket, at), expires_at_as_of(bucket, at)
        spendable = cols["available"] if status == "active" else 0
        for target in (totals, by_kind[bucket.kind]):
            for name in COLUMNS:
                target[name] += cols[name]
            target["spendable"] += spendable
        for label, horizon in EXPIRY_HORIZONS.items():
            if status == "active" and expires_at is not None and expires_at <= at + horizon:
                expiring[label] += cols["available"] + cols["held"]
        rows.append(
            {
                "id": bucket.pk,
                "kind": bucket.kind,
                "source": bucket.source,
                "project": bucket.project_id,
                "gpu_types": list(bucket.gpu_types),
                "effective_at": bucket.effective_at,
                "expires_at": expires_at,
                "closed_at": bucket.closed_at if _closed_by(bucket, at) else None,
                "reference": bucket.reference,
                "status": status,
                "spendable": spendable,
                **cols,
            }
        )
    return {
        "org": org.pk,
        "project": project.pk if project is not None else None,
        "as_of": at,
        "totals": totals,
        "paid": by_kind[BucketKind.PAID],
        "promotional": by_kind[BucketKind.PROMOTIONAL],
        "expiring": expiring,
        "buckets": rows,
        "project_usage": project_usage(project=project, as_of=as_of) if project is not None else None,
    }


def project_usage(*, project: Project, as_of: datetime | None = None) -> dict[str, int]:
    """`held` and `spent` by the project's own holds (its jobs), whichever buckets they drew on.

    Now: the holds' columns (a cache, like the bucket columns, that `verify_ledger` checks against
    the journal); as of a past time: rebuilt from the postings of those holds.
    """
    if as_of is not None:
        return project_usage_from_postings(org_id=project.org_id, project_id=project.pk, as_of=as_of)
    sums = Hold.objects.filter(project=project).aggregate(
        held=Sum(F("authorized") - F("captured") - F("released")), spent=Sum("captured")
    )
    return {name: int(sums[name] or 0) for name in ("held", "spent")}


def org_transactions(
    *,
    org: Organization,
    since: datetime | None = None,
    until: datetime | None = None,
    kind: str | None = None,
) -> QuerySet[LedgerTransaction]:
    """The org's journal, newest first, postings prefetched; `until` is exclusive."""
    qs = LedgerTransaction.objects.filter(org=org)
    if since is not None:
        qs = qs.filter(created_at__gte=since)
    if until is not None:
        qs = qs.filter(created_at__lt=until)
    if kind is not None:
        qs = qs.filter(kind=kind)
    return qs.prefetch_related("postings").order_by("-created_at", "-id")



# --- What a hold's releases became ----------------------------------------------------------------
#
# `Hold.released` counts everything a release took off the hold, including parts whose bucket had
# expired by then: those went to the `expiry` account, not back to the org (docs/ledger.md, "Where
# refunds go"). The journal says which: a release's `expiry` posting. Callers that show a hold to
# people split `released` with these, so credits lost to expiry are never labelled "released".

_TO_EXPIRY = Posting.objects.filter(transaction__kind=TransactionKind.RELEASE, account=Account.EXPIRY)


def released_to_expiry_sql(hold_ref: str = "pk") -> Coalesce:
    """An annotation: how much of the hold `hold_ref` (an OuterRef name) released went to expiry."""
    total = (
        _TO_EXPIRY.filter(transaction__hold_id=OuterRef(hold_ref))
        .values("transaction__hold_id").annotate(total=Sum("amount")).values("total")
    )
    return Coalesce(Subquery(total), 0)


def attach_release_split(holds: Iterable[Hold | None]) -> None:
    """Work out `release_split` for many holds in one query (none if nothing was released)."""
    wanted = {h.pk: h for h in holds if h is not None and h.released > 0}
    if not wanted:
        return
    totals = dict(
        _TO_EXPIRY.filter(transaction__hold_id__in=wanted)
        .values_list("transaction__hold_id").annotate(total=Sum("amount"))
    )
    for pk, hold in wanted.items():
        hold._released_to_expiry = totals.get(pk, 0)  # type: ignore[attr-defined]


def release_split(hold: Hold) -> tuple[int, int]:
    """(returned, expired): the hold's `released` split into what went back to its buckets'
    available credits and what went to expiry. One query unless nothing was released or
    `attach_release_split` already ran for it."""
    if hold.released == 0:
        return 0, 0
    expired = getattr(hold, "_released_to_expiry", None)
    if expired is None:
        attach_release_split([hold])
        expired = hold._released_to_expiry  # type: ignore[attr-defined]
    return hold.released - expired, expired
