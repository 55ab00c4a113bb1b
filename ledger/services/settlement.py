"""Capturing and releasing held credits; settling a hold exactly once.

Captures draw from a hold's lines in spend order (soonest-expiring first). Releases go back to
the exact bucket each part came from, latest-expiring first, and a part whose bucket has expired
by the time it is released goes to `expiry` instead of back to `available` (DESIGN.md §4).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F

from ledger.clock import ledger_now
from ledger.errors import CaptureExceedsHold, HoldNotActive, InvalidAmount
from ledger.locks import lock_buckets, lock_hold
from ledger.models import Account, Bucket, Hold, HoldLine, HoldState, LedgerTransaction, TransactionKind
from ledger.retry import retry_on_conflict
from ledger.services._journal import (
    AVAILABLE,
    HELD,
    Leg,
    audit,
    check_amount,
    is_expired,
    move_bucket,
    post_transaction,
    replay,
    spend_order_key,
)


def _open_lines(hold: Hold) -> list[tuple[HoldLine, Bucket]]:
    """The hold's lines that still hold something, with their buckets locked (by id), in spend order."""
    lines = [ln for ln in hold.lines.all() if ln.authorized - ln.captured - ln.released > 0]
    buckets = {b.pk: b for b in lock_buckets(ln.bucket_id for ln in lines)}
    pairs = [(ln, buckets[ln.bucket_id]) for ln in lines]
    pairs.sort(key=lambda pair: spend_order_key(pair[1]))
    return pairs


def _left(line: HoldLine) -> int:
    return line.authorized - line.captured - line.released


def _capture(hold: Hold, amount: int, key: str, now: datetime, actor: Any, reason: str) -> LedgerTransaction:
    legs: list[Leg] = []
    remaining = amount
    for line, bucket in _open_lines(hold):
        take = min(remaining, _left(line))
        if take == 0:
            break
        move_bucket(bucket.pk, source="held", target="spent", amount=take)
        HoldLine.objects.filter(pk=line.pk).update(captured=F("captured") + take)
        legs.append((HELD, bucket.pk, -take))
        remaining -= take
    legs.append((Account.CONSUMPTION, None, amount))
    Hold.objects.filter(pk=hold.pk).update(captured=F("captured") + amount)
    hold.captured += amount
    txn = post_transaction(
        org_id=hold.org_id, kind=TransactionKind.CAPTURE, key=key, legs=legs, now=now,
        params={"amount": amount}, hold=hold, memo=reason,
    )
    audit(txn=txn, subject_type="ledger.hold", subject_id=hold.pk, actor=actor, reason=reason)
    return txn


def _release(
    hold: Hold, amount: int, key: str, now: datetime, actor: Any, reason: str, params: dict[str, Any]
) -> LedgerTransaction:
    legs: list[Leg] = []
    remaining = amount
    expired_total = 0
    for line, bucket in reversed(_open_lines(hold)):
        take = min(remaining, _left(line))
        if take == 0:
            break
        if is_expired(bucket, now):
            move_bucket(bucket.pk, source="held", target="expired", amount=take)
            legs += [(HELD, bucket.pk, -take), (Account.EXPIRY, None, take)]
            expired_total += take
        else:
            move_bucket(bucket.pk, source="held", target="available", amount=take)
            legs += [(HELD, bucket.pk, -take), (AVAILABLE, bucket.pk, take)]
        HoldLine.objects.filter(pk=line.pk).update(released=F("released") + take)
        remaining -= take
    Hold.objects.filter(pk=hold.pk).update(released=F("released") + amount)
    hold.released += amount
    txn = post_transaction(
        org_id=hold.org_id, kind=TransactionKind.RELEASE, key=key, legs=legs, now=now,
        params=params, hold=hold, memo=reason,
    )
    audit(
        txn=txn, subject_type="ledger.hold", subject_id=hold.pk, actor=actor, reason=reason,
        data={"released": amount, "to_expiry": expired_total},
    )
    return txn


def _settle(hold: Hold, now: datetime) -> None:
    Hold.objects.filter(pk=hold.pk, state=HoldState.ACTIVE).update(state=HoldState.SETTLED, settled_at=now)
    hold.state = HoldState.SETTLED
    hold.settled_at = now


def _require_active(hold: Hold) -> None:
    if hold.state != HoldState.ACTIVE:
        raise HoldNotActive(f"Hold {hold.pk} is {hold.state}.", hold=hold.pk)


@retry_on_conflict()
@transaction.atomic
def capture(*, hold: Hold, amount: int, key: str, actor: Any = None, reason: str = "") -> LedgerTransaction:
    """Move `amount` of the hold to `consumption` (partial, repeatable, never beyond the hold)."""
    check_amount(amount)
    locked = lock_hold(hold.pk)
    txn_key = f"capture:{locked.pk}:{key}"
    previous = replay(
        org_id=locked.org_id, key=txn_key, kind=TransactionKind.CAPTURE, params={"amount": amount}
    )
    if previous is not None:
        return previous
    _require_active(locked)
    if amount > locked.remaining:
        raise CaptureExceedsHold(requested=amount, remaining=locked.remaining)
    return _capture(locked, amount, txn_key, ledger_now(), actor, reason)


@retry_on_conflict()
@transaction.atomic
def release_partial(
    *, hold: Hold, amount: int, key: str, actor: Any = None, reason: str = ""
) -> LedgerTransaction:
    """Give `amount` back to its origin buckets (or expiry); the hold stays active."""
    check_amount(amount)
    locked = lock_hold(hold.pk)
    txn_key = f"release:{locked.pk}:{key}"
    params = {"amount": amount, "final": False}
    previous = replay(org_id=locked.org_id, key=txn_key, kind=TransactionKind.RELEASE, params=params)
    if previous is not None:
        return previous
    _require_active(locked)
    if amount > locked.remaining:
        raise CaptureExceedsHold(requested=amount, remaining=locked.remaining)
    return _release(locked, amount, txn_key, ledger_now(), actor, reason, params)


@retry_on_conflict()
@transaction.atomic
def release_hold(*, hold: Hold, key: str | None = None, actor: Any = None, reason: str = "") -> Hold:
    """Release the whole remainder to its origin buckets (or expiry) and settle the hold."""
    locked = lock_hold(hold.pk)
    txn_key = f"release:{locked.pk}:{key or 'final'}"
    params = {"final": True}
    if key is not None and replay(
        org_id=locked.org_id, key=txn_key, kind=TransactionKind.RELEASE, params=params
    ):
        return locked
    _require_active(locked)
    now = ledger_now()
    _release(locked, locked.remaining, txn_key, now, actor, reason, params)
    _settle(locked, now)
    return locked


@retry_on_conflict()
@transaction.atomic
def settle_hold(*, hold: Hold, capture_total: int, reason: str, actor: Any = None) -> Hold:
    """Capture up to a cumulative total (clamped to the hold), release the rest, settle: exactly once."""
    if not isinstance(capture_total, int) or isinstance(capture_total, bool) or capture_total < 0:
        raise InvalidAmount(f"capture_total must be a non-negative integer, got {capture_total!r}.")
    locked = lock_hold(hold.pk)
    if locked.state != HoldState.ACTIVE:
        return locked
    now = ledger_now()
    delta = max(0, min(capture_total - locked.captured, locked.remaining))
    if delta > 0:
        _capture(locked, delta, f"capture:{locked.pk}:settle", now, actor, reason)
    _release(locked, locked.remaining, f"release:{locked.pk}:settle", now, actor, reason, {"final": True})
    _settle(locked, now)
    return locked
