"""Placing and extending holds: all-or-nothing across eligible buckets in spend order."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q

from accounts.models import Organization, Project
from ledger.clock import ledger_now
from ledger.errors import HoldNotActive, IdempotencyConflict, InsufficientCredits
from ledger.locks import lock_bucket_queryset, lock_hold
from ledger.models import Bucket, Hold, HoldLine, HoldState, LedgerTransaction, TransactionKind
from ledger.retry import retry_on_conflict
from ledger.services._journal import (
    AVAILABLE,
    HELD,
    audit,
    check_amount,
    check_gpu_types,
    check_project,
    move_bucket,
    post_transaction,
    replay,
    spend_order_key,
)


def eligible_buckets(
    *, org_id: int, project_id: int | None, gpu_types: list[str], now: datetime
) -> Any:
    """Buckets a hold may draw from now: same org, in scope, effective, unexpired, applicable.

    A bucket restricted to some GPU types funds a hold only if every type the hold may run
    on is in its list; a hold that may run anywhere only draws on unrestricted buckets.
    """
    qs = Bucket.objects.filter(org_id=org_id, available__gt=0, effective_at__lte=now).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now)
    )
    if project_id is None:
        qs = qs.filter(project__isnull=True)
    else:
        qs = qs.filter(Q(project__isnull=True) | Q(project_id=project_id))
    if gpu_types:
        qs = qs.filter(Q(gpu_types=[]) | Q(gpu_types__contains=gpu_types))
    else:
        qs = qs.filter(gpu_types=[])
    return qs


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


def _hold_funds(*, hold: Hold, amount: int, now: datetime) -> list[tuple[Bucket, int]]:
    """Lock the hold's eligible buckets (by id), move `amount` available -> held, record lines."""
    buckets = lock_bucket_queryset(
        eligible_buckets(
            org_id=hold.org_id, project_id=hold.project_id, gpu_types=list(hold.gpu_types), now=now
        )
    )
    plan = _allocate(buckets, amount)
    existing = {line.bucket_id: line for line in hold.lines.all()}
    new_lines = []
    for bucket, take in plan:
        move_bucket(bucket.pk, source="available", target="held", amount=take)
        if bucket.pk in existing:
            HoldLine.objects.filter(pk=existing[bucket.pk].pk).update(authorized=F("authorized") + take)
        else:
            new_lines.append(HoldLine(hold=hold, bucket=bucket, authorized=take))
    HoldLine.objects.bulk_create(new_lines)
    Hold.objects.filter(pk=hold.pk).update(authorized=F("authorized") + amount)
    hold.authorized += amount
    return plan


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
@transaction.atomic
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
) -> Hold:
    """Hold `amount` across eligible buckets in spend order (all-or-nothing); idempotent by (org, key)."""
    check_amount(amount)
    project_id = check_project(org.pk, project)
    types = check_gpu_types(gpu_types)
    user_id = user.pk if user is not None else None
    params = _place_params(amount, project_id, user_id, types, reference)
    existing = Hold.objects.filter(org_id=org.pk, key=key).first()
    if existing is not None:
        return _replay_hold(existing, params)
    now = ledger_now()
    hold = Hold(
        org_id=org.pk, project_id=project_id, user_id=user_id, key=key, reference=reference,
        gpu_types=types, created_at=now,
    )
    try:
        # The hold row is the idempotency record: inserting it first is the first lock taken.
        with transaction.atomic():
            hold.save(force_insert=True)
    except IntegrityError:
        return _replay_hold(Hold.objects.get(org_id=org.pk, key=key), params)
    plan = _hold_funds(hold=hold, amount=amount, now=now)
    txn = post_transaction(
        org_id=org.pk,
        kind=TransactionKind.HOLD,
        key=f"hold:{key}",
        legs=[leg for b, take in plan for leg in ((AVAILABLE, b.pk, -take), (HELD, b.pk, take))],
        now=now,
        params=params,
        hold=hold,
        memo=reference,
    )
    audit(
        txn=txn, subject_type="ledger.hold", subject_id=hold.pk, actor=actor,
        data={"reference": reference, "buckets": {str(b.pk): take for b, take in plan}},
    )
    return hold


@retry_on_conflict()
@transaction.atomic
def extend_hold(*, hold: Hold, amount: int, key: str, actor: Any = None) -> Hold:
    """Hold `amount` more for an active hold, from the same eligible buckets (all-or-nothing)."""
    check_amount(amount)
    locked = lock_hold(hold.pk)
    txn_key = f"extend:{locked.pk}:{key}"
    params = {"amount": amount}
    if replay(org_id=locked.org_id, key=txn_key, kind=TransactionKind.EXTEND, params=params):
        return locked
    if locked.state != HoldState.ACTIVE:
        raise HoldNotActive(f"Hold {locked.pk} is {locked.state}.", hold=locked.pk)
    now = ledger_now()
    plan = _hold_funds(hold=locked, amount=amount, now=now)
    txn = post_transaction(
        org_id=locked.org_id,
        kind=TransactionKind.EXTEND,
        key=txn_key,
        legs=[leg for b, take in plan for leg in ((AVAILABLE, b.pk, -take), (HELD, b.pk, take))],
        now=now,
        params=params,
        hold=locked,
    )
    audit(
        txn=txn, subject_type="ledger.hold", subject_id=locked.pk, actor=actor,
        data={"buckets": {str(b.pk): take for b, take in plan}},
    )
    return locked
