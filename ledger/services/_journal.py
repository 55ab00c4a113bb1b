"""Shared plumbing for ledger services: validation, spend order, journal writes, audit, replays."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db.models import F

from audit.services import record
from config.request_context import current_request_id
from ledger.errors import IdempotencyConflict, InvalidAmount, InvalidParameter, UnknownGpuType
from ledger.models import Account, Bucket, BucketKind, Hold, LedgerTransaction, Posting

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
) -> None:
    actor_type, actor_id = actor_fields(actor)
    record(
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


AVAILABLE = Account.BUCKET_AVAILABLE
HELD = Account.BUCKET_HELD
