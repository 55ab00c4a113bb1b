"""Placing and extending holds: all-or-nothing across eligible buckets in spend order."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Q, Sum

from accounts.models import Organization, Project
from audit.services import Reserved
from ledger.clock import clock_offset, expiry_clock, ledger_now, ledger_time
from ledger.errors import HoldNotActive, IdempotencyConflict, InsufficientCredits
from ledger.locks import lock_bucket_queryset, lock_eligible_buckets_sql, lock_hold_with_clock
from ledger.models import Bucket, Hold, HoldState, LedgerTransaction, TransactionKind
from ledger.retry import retry_on_conflict
from ledger.services import _sql
from ledger.services._journal import (
    AVAILABLE,
    HELD,
    CallerEvent,
    Movement,
    audit,
    audit_as_caller,
    check_amount,
    check_gpu_types,
    check_project,
    replay,
    spend_order_key,
    write_movement,
)


def eligible_buckets(
    *, org_id: int, project_id: int | None, gpu_types: list[str], now: datetime
) -> Any:
    """Buckets a hold may draw from now: same org, in scope, effective, unexpired, applicable.

    A bucket restricted to some GPU types funds a hold only if every type the hold may run
    on is in its list; a hold that may run anywhere only draws on unrestricted buckets.
    """
    qs = _in_scope(org_id=org_id, project_id=project_id, now=now)
    if gpu_types and connection.vendor != "postgresql":
        # Embedded SQLite has no JSON containment; it has no row locks either, so narrowing
        # in Python locks nothing extra.
        wanted = set(gpu_types)
        ids = [pk for pk, types in qs.values_list("pk", "gpu_types") if not types or wanted <= set(types)]
        qs = qs.filter(pk__in=ids)
    elif gpu_types:
        qs = qs.filter(Q(gpu_types=[]) | Q(gpu_types__contains=gpu_types))
    else:
        qs = qs.filter(gpu_types=[])
    return qs


def _in_scope(*, org_id: int, project_id: int | None, now: datetime) -> Any:
    """Funded buckets of the org a hold of `project_id` may draw on now, whatever their GPU types."""
    qs = Bucket.objects.filter(org_id=org_id, available__gt=0, effective_at__lte=now).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )
    if project_id is None:
        return qs.filter(project__isnull=True)
    return qs.filter(Q(project__isnull=True) | Q(project_id=project_id))


def spendable_by_gpu_types(
    *, org_id: int, project_id: int | None, now: datetime
) -> dict[tuple[str, ...], int]:
    """{a bucket restriction (sorted GPU type names; () = any type): available credits under it}
    that a hold of the org (and project) could draw on now. One grouped read, unlocked: for
    choosing which of a job's types to hold for; the placement locks and re-checks."""
    spendable: dict[tuple[str, ...], int] = {}
    rows = (_in_scope(org_id=org_id, project_id=project_id, now=now).order_by()
            .values_list("gpu_types").annotate(total=Sum("available")))
    for types, total in rows:
        key = tuple(sorted(types or ()))
        spendable[key] = spendable.get(key, 0) + int(total or 0)
    return spendable


def pays_for(restriction: Iterable[str], gpu_types: Iterable[str]) -> bool:
    """Whether a bucket restricted to `restriction` (empty: any type) may fund a hold for
    `gpu_types` (the rule of `eligible_buckets`)."""
    allowed, wanted = set(restriction), set(gpu_types)
    return not allowed or bool(wanted and wanted <= allowed)


def funds_for(spendable: dict[tuple[str, ...], int], gpu_types: Iterable[str]) -> int:
    """What of `spendable` a hold for `gpu_types` may draw on."""
    return sum(total for types, total in spendable.items() if pays_for(types, gpu_types))


def lock_eligible_buckets(
    *, org_id: int, project_id: int | None, gpu_types: list[str], now: datetime
) -> list[Bucket]:
    """Lock (by id) and re-read the buckets `eligible_buckets` selects; plain SQL on PostgreSQL."""
    if connection.vendor != "postgresql":
        return lock_bucket_queryset(
            eligible_buckets(org_id=org_id, project_id=project_id, gpu_types=gpu_types, now=now)
        )
    where = [
        "b.org_id = %s AND b.available > 0 AND b.effective_at <= %s "
        "AND (b.expires_at IS NULL OR b.expires_at > %s)"
    ]
    params: list[Any] = [org_id, now, now]
    if project_id is None:
        where.append("b.project_id IS NULL")
    else:
        where.append("(b.project_id IS NULL OR b.project_id = %s)")
        params.append(project_id)
    if gpu_types:
        where.append("(b.gpu_types = '[]'::jsonb OR b.gpu_types @> %s::jsonb)")
        params.append(json.dumps(gpu_types))
    else:
        where.append("b.gpu_types = '[]'::jsonb")
    locked = lock_eligible_buckets_sql(" AND ".join(where), params)
    # Unexpired by the database's wall clock once locked (ADR 0012): a placement that began before
    # a bucket's expiry and waited for its lock past it drew on the expired bucket (review).
    wall = expiry_clock((b.expires_at for b in locked), now)
    return [b for b in locked if b.expires_at is None or b.expires_at > wall]


def _allocate(buckets: list[Bucket], amount: int) -> list[tuple[Bucket, int]]:
    """Take `amount` from locked buckets in spend order, or raise with what was there."""
    plan: list[tuple[Bucket, int]] = []
    remaining = amount
    for bucket in sorted(buckets, key=spend_order_key):
        if remaining == 0:
            break
        take = min(remaining, bucket.available)
        if take > 0:
            plan.append((bucket, take))
            remaining -= take
    if remaining > 0:
        raise InsufficientCredits(needed=amount, available=sum(b.available for b in buckets))
    return plan


def _hold_funds(
    *, hold: Hold, amount: int, now: datetime, kind: str, key: str, params: dict[str, Any],
    memo: str = "", new_hold: bool = False, run_type: str | None = None,
) -> tuple[LedgerTransaction, list[tuple[Bucket, int]], Reserved | None]:
    """Lock the hold's eligible buckets (by id), move `amount` available -> held, record lines,
    and write it all (one statement on PostgreSQL) with its journal transaction; the same statement
    reserves the org's audit chain head (returned) for the caller's one audit event.

    `run_type` (`extend_hold`): the buckets for that type are locked at once (a superset of the
    hold's own); when the hold's own cannot fund `amount`, the hold is narrowed to `[run_type]`."""
    types = list(hold.gpu_types)
    wider = run_type is not None and types != [run_type] and (not types or run_type in types)
    buckets = lock_eligible_buckets(
        org_id=hold.org_id, project_id=hold.project_id, gpu_types=[run_type] if wider else types, now=now
    )
    own = [b for b in buckets if pays_for(b.gpu_types, types)]
    try:
        plan = _allocate(own, amount)
    except InsufficientCredits:
        if not wider or len(own) == len(buckets):
            raise
        # The hold's own buckets first, all they have; only the rest from credits restricted to
        # `run_type` (review: the whole amount was re-allocated in spend order, so a restricted
        # bucket spent first paid while the hold's own credits stayed unused).
        own_ids = {b.pk for b in own}
        plan = [(b, b.available) for b in sorted(own, key=spend_order_key) if b.available > 0]
        try:
            plan += _allocate([b for b in buckets if b.pk not in own_ids], amount - sum(t for _, t in plan))
        except InsufficientCredits:
            raise InsufficientCredits(needed=amount, available=sum(b.available for b in buckets)) from None
        # Its lines now draw on credits restricted to `run_type`: the hold may pay for that type only.
        Hold.objects.filter(pk=hold.pk).update(gpu_types=[run_type])
        hold.gpu_types = [run_type]
    # A hold inserted by this transaction has no lines yet: no need to read them.
    existing = {} if new_hold else {line.bucket_id: line for line in hold.lines.all()}
    m = Movement(org_id=hold.org_id, kind=kind, key=key, now=now, params=params, hold=hold, memo=memo)
    for bucket, take in plan:
        m.move(bucket.pk, source="available", target="held", amount=take)
        m.legs += [(AVAILABLE, bucket.pk, -take), (HELD, bucket.pk, take)]
        if bucket.pk in existing:
            m.line(existing[bucket.pk].pk, "authorized", take)
        else:
            m.new_lines.append((bucket.pk, take))
    m.hold_deltas["authorized"] = amount
    txn = write_movement(m, reserve_audit=True)
    return txn, plan, m.audit_head


def _insert_hold(hold: Hold) -> bool:
    """Insert the hold row (the idempotency record); False when (org, key) already exists.

    On PostgreSQL one `INSERT … ON CONFLICT DO NOTHING RETURNING` also reads the DB clock, so
    `hold.created_at` is the transaction's `now()` (+ the test offset) without another query.
    """
    if connection.vendor != "postgresql":
        hold.created_at = ledger_now()
        try:
            with transaction.atomic():
                hold.save(force_insert=True)
        except IntegrityError:
            return False
        return True
    table = Hold._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (org_id, project_id, user_id, key, reference, gpu_types, state, "  # noqa: S608
            "authorized, captured, released, created_at) "
            "VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, 0, 0, 0, now() + %s) "
            "ON CONFLICT (org_id, key) DO NOTHING RETURNING id, created_at",
            [hold.org_id, hold.project_id, hold.user_id, hold.key, hold.reference,
             json.dumps(hold.gpu_types), HoldState.ACTIVE, clock_offset()],
        )
        row = cursor.fetchone()
    if row is None:
        return False
    hold.pk, hold.created_at = row
    hold._state.adding = False
    hold._state.db = connection.alias
    return True


def _place_params(
    amount: int, project_id: int | None, user_id: int | None, types: list[str], reference: str
) -> dict[str, Any]:
    return {
        "amount": amount,
        "project": project_id,
        "user": user_id,
        "gpu_types": types,
        "reference": reference,
    }


def _replay_hold(hold: Hold, params: dict[str, Any]) -> Hold:
    placed = LedgerTransaction.objects.filter(org_id=hold.org_id, key=f"hold:{hold.key}").first()
    if placed is None or placed.params != params:
        raise IdempotencyConflict(
            f"Hold key {hold.key!r} was already used with different parameters.", key=hold.key
        )
    return hold


@retry_on_conflict()
def place_hold(
    *,
    org: Organization,
    amount: int,
    key: str,
    project: Project | None = None,
    user: Any = None,
    gpu_types: Iterable[str] = (),
    reference: str = "",
    actor: Any = None,
    audit_as: CallerEvent | None = None,
    gpu_types_checked: bool = False,
    savepoint: bool = True,
) -> Hold:
    """Hold `amount` across eligible buckets in spend order (all-or-nothing); idempotent by (org, key).

    `audit_as`: record the placement as the caller's own event (with the hold's facts added)
    instead of a separate `ledger.hold` event; a replay records nothing (the original stands).
    `gpu_types_checked`: the caller already checked the names against the GPU types (no query).
    `savepoint=False` (nested in a caller's transaction): no savepoint round trips; a refusal then
    dooms the caller's whole transaction, which is what job submission wants anyway.
    """
    with _sql.scope(savepoint=savepoint) if _sql.enabled() else transaction.atomic(savepoint=savepoint):
        return _place_hold(
            org=org, amount=amount, key=key, project=project, user=user, gpu_types=gpu_types,
            reference=reference, actor=actor, audit_as=audit_as, gpu_types_checked=gpu_types_checked,
        )


def _place_hold(
    *, org: Organization, amount: int, key: str, project: Project | None, user: Any,
    gpu_types: Iterable[str], reference: str, actor: Any, audit_as: CallerEvent | None,
    gpu_types_checked: bool,
) -> Hold:
    check_amount(amount)
    project_id = check_project(org.pk, project)
    types = sorted(set(gpu_types)) if gpu_types_checked else check_gpu_types(gpu_types)
    user_id = user.pk if user is not None else None
    params = _place_params(amount, project_id, user_id, types, reference)
    if _sql.enabled():  # PostgreSQL: one function call locks, decides, writes and audits
        placed = _sql.place_hold(
            org_id=org.pk, project_id=project_id, user_id=user_id, key=key, reference=reference,
            types=types, amount=amount, params=params, actor=actor, audit_as=audit_as,
        )
        return placed or _replay_hold(Hold.objects.get(org_id=org.pk, key=key), params)
    hold = Hold(
        org_id=org.pk, project_id=project_id, user_id=user_id, key=key, reference=reference,
        gpu_types=types,
    )
    # The hold row is the idempotency record: inserting it first is the first lock taken (a
    # concurrent insert of the same key waits for the other transaction, then replays).
    if not _insert_hold(hold):
        return _replay_hold(Hold.objects.get(org_id=org.pk, key=key), params)
    txn, plan, head = _hold_funds(
        hold=hold, amount=amount, now=hold.created_at, kind=TransactionKind.HOLD, key=f"hold:{key}",
        params=params, memo=reference, new_hold=True,
    )
    facts = {"reference": reference, "buckets": {str(b.pk): take for b, take in plan}}
    if audit_as is not None:
        audit_as_caller(txn=txn, event=audit_as, actor=actor, data={"hold": hold.pk, **facts},
                        reserved=head)
    else:
        audit(txn=txn, subject_type="ledger.hold", subject_id=hold.pk, actor=actor, data=facts,
              reserved=head)
    return hold


@retry_on_conflict()
@transaction.atomic
def extend_hold(
    *, hold: Hold, amount: int, key: str, actor: Any = None, run_type: str | None = None, reason: str = "",
) -> Hold:
    """Hold `amount` more for an active hold, from the same eligible buckets (all-or-nothing).

    `run_type`: the one GPU type the hold's job runs (or is being placed) on, one of the hold's
    types. When the buckets for all of the hold's types cannot fund the extension, those for that
    type can too (credits restricted to it): the hold is then narrowed to it (`gpu_types` becomes
    `[run_type]`, in the audit event's data), so those credits never pay for another type (review:
    a run on A100 held for A100 and H100 was stopped out of credit beside unused A100 credits)."""
    check_amount(amount)
    locked, clock = lock_hold_with_clock(hold.pk)
    txn_key = f"extend:{locked.pk}:{key}"
    params: dict[str, Any] = {"amount": amount}
    if run_type is not None:  # a replay for another type is another request (review)
        params["run_type"] = run_type
    if replay(org_id=locked.org_id, key=txn_key, kind=TransactionKind.EXTEND, params=params):
        return locked
    if locked.state != HoldState.ACTIVE:
        raise HoldNotActive(f"Hold {locked.pk} is {locked.state}.", hold=locked.pk)
    before = list(locked.gpu_types)
    txn, plan, head = _hold_funds(
        hold=locked, amount=amount, now=ledger_time(clock), kind=TransactionKind.EXTEND, key=txn_key,
        params=params, run_type=run_type, memo=reason,
    )
    data: dict[str, Any] = {"buckets": {str(b.pk): take for b, take in plan}}
    if locked.gpu_types != before:
        data["gpu_types"] = {"from": before, "to": list(locked.gpu_types)}
    audit(txn=txn, subject_type="ledger.hold", subject_id=locked.pk, actor=actor, data=data, reserved=head,
          reason=reason)
    hold.gpu_types = list(locked.gpu_types)
    return locked
