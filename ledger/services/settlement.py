"""Capturing and releasing held credits; settling a hold exactly once.

Captures draw from a hold's lines in spend order (soonest-expiring first). Releases go back to
the exact bucket each part came from, latest-expiring first, and a part whose bucket has expired
by the time it is released goes to `expiry` instead of back to `available` (DESIGN.md §4).

Each operation: lock the hold (the same statement reads the DB clock), look for a replay of the key,
lock the hold's open lines' buckets by id (the same query re-reads the lines), decide, then write
everything in one statement (`write_movement`) and append its audit event.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction

from audit.services import NewEvent, record_many
from config.clock import db_now
from ledger.clock import expiry_clock, ledger_time
from ledger.errors import (
    CaptureExceedsHold,
    HoldNotActive,
    IdempotencyConflict,
    InvalidAmount,
    InvalidParameter,
)
from ledger.locks import (
    lock_hold_with_clock,
    lock_holds,
    lock_open_lines,
    lock_open_lines_of,
    lock_open_lines_seeing_key,
)
from ledger.models import Account, Hold, HoldLine, HoldState, LedgerTransaction, TransactionKind
from ledger.retry import retry_on_conflict
from ledger.services import _sql
from ledger.services._journal import (
    AVAILABLE,
    HELD,
    Movement,
    actor_fields,
    audit,
    check_amount,
    is_expired,
    replay,
    spend_order_key,
    write_movement,
    write_movements,
)


def _left(line: HoldLine) -> int:
    return line.authorized - line.captured - line.released


def _in_spend_order(lines: list[HoldLine]) -> list[HoldLine]:
    return sorted(lines, key=lambda ln: spend_order_key(ln.bucket))


def _plan_capture(m: Movement, lines: list[HoldLine], amount: int) -> None:
    remaining = amount
    for line in _in_spend_order(lines):
        take = min(remaining, _left(line))
        if take == 0:
            break
        m.move(line.bucket_id, source="held", target="spent", amount=take)
        m.line(line.pk, "captured", take)
        m.legs.append((HELD, line.bucket_id, -take))
        line.captured += take
        remaining -= take
    m.legs.append((Account.CONSUMPTION, None, amount))
    m.hold_deltas["captured"] = m.hold_deltas.get("captured", 0) + amount


def _expiry_clock(lines: list[HoldLine], now: datetime) -> datetime:
    """`expiry_clock` of the lines' (locked) buckets. Review: a release whose transaction began
    before a bucket's expiry (or close) but got the bucket's lock after the expiry sweep (the
    close) had committed gave credits back to the `available` of a bucket past its end, and every
    later sweep of it failed on its journal key."""
    return expiry_clock((line.bucket.expires_at for line in lines), now)


def _plan_release(
    m: Movement, lines: list[HoldLine], amount: int, now: datetime, expiry_now: datetime | None = None
) -> int:
    """Plan giving back `amount`, latest-expiring first; returns how much went to expiry. The
    lines' buckets are locked (and re-read); `expiry_now`: `_expiry_clock` of them, if known."""
    remaining = amount
    expired_total = 0
    expiry_now = expiry_now or _expiry_clock(lines, now)
    for line in reversed(_in_spend_order(lines)):
        take = min(remaining, _left(line))
        if take == 0:
            break
        if is_expired(line.bucket, expiry_now):
            m.move(line.bucket_id, source="held", target="expired", amount=take)
            m.legs += [(HELD, line.bucket_id, -take), (Account.EXPIRY, None, take)]
            expired_total += take
        else:
            m.move(line.bucket_id, source="held", target="available", amount=take)
            m.legs += [(HELD, line.bucket_id, -take), (AVAILABLE, line.bucket_id, take)]
        m.line(line.pk, "released", take)
        line.released += take
        remaining -= take
    m.hold_deltas["released"] = m.hold_deltas.get("released", 0) + amount
    return expired_total


def _capture(
    hold: Hold, lines: list[HoldLine], amount: int, key: str, now: datetime, actor: Any, reason: str
) -> LedgerTransaction:
    m = Movement(org_id=hold.org_id, kind=TransactionKind.CAPTURE, key=key, now=now,
                 params={"amount": amount}, hold=hold, memo=reason)
    _plan_capture(m, lines, amount)
    txn = write_movement(m, reserve_audit=True)
    audit(txn=txn, subject_type="ledger.hold", subject_id=hold.pk, actor=actor, reason=reason,
          reserved=m.audit_head)
    return txn


def _release(
    hold: Hold, lines: list[HoldLine], amount: int, key: str, now: datetime, actor: Any, reason: str,
    params: dict[str, Any], *, settle: bool = False,
) -> LedgerTransaction:
    m = Movement(org_id=hold.org_id, kind=TransactionKind.RELEASE, key=key, now=now, params=params,
                 hold=hold, memo=reason, settle=settle)
    expired_total = _plan_release(m, lines, amount, now)
    txn = write_movement(m, reserve_audit=True)
    audit(
        txn=txn, subject_type="ledger.hold", subject_id=hold.pk, actor=actor, reason=reason,
        data={"released": amount, "to_expiry": expired_total}, reserved=m.audit_head,
    )
    return txn


def _require_active(hold: Hold) -> None:
    if hold.state != HoldState.ACTIVE:
        raise HoldNotActive(f"Hold {hold.pk} is {hold.state}.", hold=hold.pk)


@retry_on_conflict()
def capture(*, hold: Hold, amount: int, key: str, actor: Any = None, reason: str = "") -> LedgerTransaction:
    """Move `amount` of the hold to `consumption` (partial, repeatable, never beyond the hold)."""
    check_amount(amount)
    txn_key = f"capture:{hold.pk}:{key}"
    if _sql.enabled():  # PostgreSQL: one function call locks, decides, writes and audits
        with _sql.scope():
            return _sql.capture(hold_id=hold.pk, amount=amount, txn_key=txn_key, actor=actor,
                                reason=reason)
    with transaction.atomic():
        return _capture_orm(hold, amount, txn_key, actor, reason)


def _capture_orm(hold: Hold, amount: int, txn_key: str, actor: Any, reason: str) -> LedgerTransaction:
    locked, clock = lock_hold_with_clock(hold.pk)
    # The replay lookup rides on the line/bucket lock (taken after the hold lock, so it sees a
    # same-key writer that committed while we waited); look it up only if it may exist.
    lines, maybe_replay = lock_open_lines_seeing_key(locked, txn_key)
    previous = maybe_replay and replay(
        org_id=locked.org_id, key=txn_key, kind=TransactionKind.CAPTURE, params={"amount": amount}
    )
    if previous:
        return previous
    _require_active(locked)
    if amount > locked.remaining:
        raise CaptureExceedsHold(requested=amount, remaining=locked.remaining)
    return _capture(locked, lines, amount, txn_key, ledger_time(clock), actor, reason)


@retry_on_conflict()
@transaction.atomic
def release_partial(
    *, hold: Hold, amount: int, key: str, actor: Any = None, reason: str = ""
) -> LedgerTransaction:
    """Give `amount` back to its origin buckets (or expiry); the hold stays active."""
    check_amount(amount)
    txn_key = f"release:{hold.pk}:{key}"
    params = {"amount": amount, "final": False}
    locked, clock = lock_hold_with_clock(hold.pk)
    lines, maybe_replay = lock_open_lines_seeing_key(locked, txn_key)
    previous = maybe_replay and replay(
        org_id=locked.org_id, key=txn_key, kind=TransactionKind.RELEASE, params=params
    )
    if previous:
        return previous
    _require_active(locked)
    if amount > locked.remaining:
        raise CaptureExceedsHold(requested=amount, remaining=locked.remaining)
    return _release(locked, lines, amount, txn_key, ledger_time(clock), actor, reason, params)


@retry_on_conflict()
def release_hold(*, hold: Hold, key: str | None = None, actor: Any = None, reason: str = "") -> Hold:
    """Release the whole remainder to its origin buckets (or expiry) and settle the hold."""
    txn_key = f"release:{hold.pk}:{key or 'final'}"
    if _sql.enabled():  # PostgreSQL: one function call locks, decides, writes and audits
        with _sql.scope():
            return _sql.release_hold(hold_id=hold.pk, txn_key=txn_key, check_replay=key is not None,
                                     actor=actor, reason=reason)
    with transaction.atomic():
        return _release_hold_orm(hold, key, txn_key, actor, reason)


def _release_hold_orm(hold: Hold, key: str | None, txn_key: str, actor: Any, reason: str) -> Hold:
    params = {"final": True}
    locked, clock = lock_hold_with_clock(hold.pk)
    lines, maybe_replay = lock_open_lines_seeing_key(locked, txn_key)
    if key is not None and maybe_replay and replay(
        org_id=locked.org_id, key=txn_key, kind=TransactionKind.RELEASE, params=params
    ):
        return locked
    _require_active(locked)
    _release(locked, lines, locked.remaining, txn_key, ledger_time(clock), actor, reason, params,
             settle=True)
    return locked


@retry_on_conflict()
@transaction.atomic
def settle_hold(*, hold: Hold, capture_total: int, reason: str, actor: Any = None) -> Hold:
    """Capture up to a cumulative total (clamped to the hold), release the rest, settle: exactly once."""
    if not isinstance(capture_total, int) or isinstance(capture_total, bool) or capture_total < 0:
        raise InvalidAmount(f"capture_total must be a non-negative integer, got {capture_total!r}.")
    locked, clock = lock_hold_with_clock(hold.pk)
    if locked.state != HoldState.ACTIVE:
        return locked
    now = ledger_time(clock)
    lines = lock_open_lines(locked.pk)
    delta = max(0, min(capture_total - locked.captured, locked.remaining))
    if delta > 0:
        _capture(locked, lines, delta, f"capture:{locked.pk}:settle", now, actor, reason)
    _release(locked, lines, locked.remaining, f"release:{locked.pk}:settle", now, actor, reason,
             {"final": True}, settle=True)
    return locked


@retry_on_conflict()
@transaction.atomic
def release_partial_many(
    *, items: Sequence[tuple[Hold, int, str]], actor: Any = None, reason: str = ""
) -> list[LedgerTransaction]:
    """`release_partial` for many holds at once: each (hold, amount, key) keeps its own semantics
    (journal key `release:<hold>:<key>`, replay, checks, one transaction and audit event each),
    but the holds are locked in one query (by id), then every affected bucket in one query (by
    id), and the writes and audit events go in as a few bulk statements.

    All-or-nothing like any one service call: an inactive hold or an amount beyond what is left
    raises, and nothing is written.
    """
    if not items:
        return []
    for _, amount, _ in items:
        check_amount(amount)
    hold_ids = sorted({hold.pk for hold, _, _ in items})
    if len(hold_ids) != len(items):
        raise InvalidParameter("release_partial_many takes each hold at most once.")
    locked = {h.pk: h for h in lock_holds(hold_ids)}
    now = ledger_time(db_now())
    keyed = [(locked[hold.pk], amount, f"release:{hold.pk}:{key}") for hold, amount, key in items]
    existing = {
        (t.org_id, t.key): t
        for t in LedgerTransaction.objects.filter(
            org_id__in={h.org_id for h, _, _ in keyed}, key__in=[k for _, _, k in keyed]
        )
    }
    results: dict[int, LedgerTransaction] = {}
    todo: list[tuple[Hold, int, str, dict[str, Any]]] = []
    for hold, amount, txn_key in keyed:
        params = {"amount": amount, "final": False}
        previous = existing.get((hold.org_id, txn_key))
        if previous is not None:
            if previous.kind != TransactionKind.RELEASE or previous.params != params:
                raise IdempotencyConflict(
                    f"Key {txn_key!r} was already used for a different {previous.kind} request.",
                    key=txn_key, original=previous.params,
                )
            results[hold.pk] = previous
            continue
        _require_active(hold)
        if amount > hold.remaining:
            raise CaptureExceedsHold(requested=amount, remaining=hold.remaining)
        todo.append((hold, amount, txn_key, params))
    lines_by_hold: dict[int, list[HoldLine]] = defaultdict(list)
    all_lines = lock_open_lines_of([hold.pk for hold, _, _, _ in todo])
    for line in all_lines:
        lines_by_hold[line.hold_id].append(line)
    expiry_now = _expiry_clock(all_lines, now)  # one read of the wall clock for them all
    movements, expired = [], []
    for hold, amount, txn_key, params in todo:
        m = Movement(org_id=hold.org_id, kind=TransactionKind.RELEASE, key=txn_key, now=now,
                     params=params, hold=hold, memo=reason)
        expired.append(_plan_release(m, lines_by_hold[hold.pk], amount, now, expiry_now))
        movements.append(m)
    txns = write_movements(movements)
    actor_type, actor_id = actor_fields(actor)
    record_many([
        NewEvent(
            action=f"ledger.{txn.kind}", subject_type="ledger.hold", subject_id=hold.pk,
            org_id=txn.org_id, actor_type=actor_type, actor_id=actor_id, amount=txn.amount,
            reason_code=txn.kind,
            data={"transaction": txn.pk, "key": txn.key, "reason": reason, "released": amount,
                  "to_expiry": to_expiry},
        )
        for (hold, amount, _, _), txn, to_expiry in zip(todo, txns, expired, strict=True)
    ])
    for (hold, _, _, _), txn in zip(todo, txns, strict=True):
        results[hold.pk] = txn
    return [results[hold.pk] for hold, _, _ in items]
