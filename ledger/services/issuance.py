"""Issuing credits (purchase, grant, promotion) and voiding what is still available."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.db import IntegrityError, transaction

from accounts.models import Organization, Project
from audit.services import record
from config.text import has_control_characters
from ledger.amounts import MAX_AMOUNT
from ledger.clock import ledger_now
from ledger.errors import (
    IdempotencyConflict,
    InsufficientCredits,
    InvalidAmount,
    InvalidExpiry,
    InvalidParameter,
)
from ledger.locks import lock_buckets
from ledger.models import (
    MICRO,
    Account,
    Bucket,
    BucketKind,
    BucketSource,
    LedgerTransaction,
    TransactionKind,
)
from ledger.money import format_credits
from ledger.retry import retry_on_conflict
from ledger.services._journal import (
    AVAILABLE,
    acting_user,
    actor_fields,
    audit,
    check_amount,
    check_gpu_types,
    check_project,
    move_bucket,
    post_transaction,
    replay,
)
from ledger.signals import funds_changed


def _issue_params(bucket: Bucket) -> dict[str, Any]:
    """The terms it was issued with (a closed bucket's expiry was moved by the closing, not issued)."""
    expires_at = bucket.expires_at_before_close if bucket.closed_at is not None else bucket.expires_at
    return {
        "amount": bucket.granted,
        "kind": bucket.kind,
        "source": bucket.source,
        "project": bucket.project_id,
        "gpu_types": list(bucket.gpu_types),
        "expires_at": expires_at.astimezone(UTC).isoformat() if expires_at else None,
    }


def _same_grant(bucket: Bucket, wanted: Bucket, effective_given: bool) -> Bucket:
    if _issue_params(bucket) != _issue_params(wanted) or (
        effective_given and bucket.effective_at != wanted.effective_at
    ):
        raise IdempotencyConflict(
            f"Reference {bucket.reference!r} was already issued with different parameters.",
            reference=bucket.reference,
            bucket=bucket.pk,
        )
    bucket.replayed = True
    return bucket


REFUND_REFERENCE_PREFIX = "refund:"


def reference_problem(reference: str) -> str | None:
    """What is wrong with a finance reference finance issues credits under, if anything (the API's
    serializer asks too, so every refusal has the same shape: QA saw two)."""
    # Review: a refund then hit it (500); QA: in any case.
    if reference.lower().startswith(REFUND_REFERENCE_PREFIX):
        return f"References starting with {REFUND_REFERENCE_PREFIX!r} are kept for refunds of jobs."
    if has_control_characters(reference):
        # QA: a newline or tab in an invoice reference was accepted (statements and exports show it).
        return "A finance reference must not contain line breaks or control characters."
    return None


@retry_on_conflict()
@transaction.atomic
def issue_credits(
    *,
    org: Organization,
    amount: int,
    kind: str,
    source: str,
    reference: str,
    reason: str,
    effective_at: datetime | None = None,
    expires_at: datetime | None = None,
    project: Project | None = None,
    gpu_types: Iterable[str] = (),
    actor: Any = None,
) -> Bucket:
    """Create a bucket funded from `issuance`; idempotent by (org, reference).

    The bucket returned for a reference already issued with the same parameters has
    `replayed = True` (nothing new was written), so a caller can say so instead of "issued".
    """
    check_amount(amount)
    if amount > MAX_AMOUNT:
        # The API and the admin form refuse it too; checked here so that no path can issue more.
        raise InvalidAmount(
            f"At most {MAX_AMOUNT} micro-credits ({MAX_AMOUNT // MICRO:,} credits) per issue, got {amount}.",
            maximum=MAX_AMOUNT,
        )
    if kind not in BucketKind.values:
        raise InvalidParameter(f"Unknown credit kind {kind!r}.", field="kind")
    if source not in BucketSource.values:
        raise InvalidParameter(f"Unknown credit source {source!r}.", field="source")
    if source == BucketSource.REFUND:
        # A refund is tied to the job it pays back and capped by its charges: `refund_job` only.
        raise InvalidParameter("Refunds are issued by crediting a job, not as a grant.", field="source")
    if not reference or len(reference) > 128:
        raise InvalidParameter("A finance reference (1-128 characters) is required.", field="reference")
    if problem := reference_problem(reference):
        raise InvalidParameter(problem, field="reference")
    if not reason or not reason.strip():
        raise InvalidParameter("A reason is required.", field="reason")
    project_id = check_project(org.pk, project)
    types = check_gpu_types(gpu_types)
    now = ledger_now()
    effective = effective_at or now
    if expires_at is not None and effective_at is not None and expires_at <= effective_at:
        raise InvalidExpiry("The expiry must be after the effective time.")
    wanted = Bucket(
        org_id=org.pk,
        project_id=project_id,
        kind=kind,
        source=source,
        gpu_types=types,
        effective_at=effective,
        expires_at=expires_at,
        granted=amount,
        available=amount,
        reference=reference,
        reason=reason,
        created_by=acting_user(actor),
    )
    existing = Bucket.objects.filter(org_id=org.pk, reference=reference).first()
    if existing is not None:
        # A replay answers as the original did, even once that grant's expiry has passed.
        return _same_grant(existing, wanted, effective_at is not None)
    if expires_at is not None and expires_at <= now:
        # Credits born expired would show as available until the next expiry sweep.
        raise InvalidExpiry("The expiry is in the past.", expires_at=expires_at.isoformat())
    try:
        with transaction.atomic():
            wanted.save(force_insert=True)
    except IntegrityError:
        # A concurrent issue with the same reference committed first.
        existing = Bucket.objects.get(org_id=org.pk, reference=reference)
        return _same_grant(existing, wanted, effective_at is not None)
    txn = post_transaction(
        org_id=org.pk,
        kind=TransactionKind.ISSUE,
        key=f"issue:{reference}",
        legs=[(Account.ISSUANCE, None, -amount), (AVAILABLE, wanted.pk, amount)],
        now=now,
        params=_issue_params(wanted),
        memo=reason,
    )
    audit(
        txn=txn, subject_type="ledger.bucket", subject_id=wanted.pk, actor=actor, reason=reason,
        reason_code=source, data={"kind": kind, "project": project_id},
    )
    funds_changed.send(sender=Bucket, org_id=org.pk)
    return wanted


@transaction.atomic
def issue_refund(
    *,
    org: Organization,
    amount: int,
    reference: str,
    reason: str,
    params: dict[str, Any],
    expires_at: datetime | None = None,
    actor: Any = None,
) -> Bucket:
    """Give `amount` back to the org as a new paid bucket (source `refund`), funded from the
    `refund` system account: refund -a, bucket.available +a (docs/ledger.md, "Refunds").

    For `scheduling.services.refunds.refund_job`, which locks the job, checks the amount against
    its charges and keeps the record that links the bucket to the job; `params` (job, attempt,
    amount) are the journal transaction's and the audit event's. Not idempotent by itself: the
    caller's record is (its bucket's `reference` is unique per org, the last line)."""
    check_amount(amount)
    if amount > MAX_AMOUNT:
        raise InvalidAmount(f"At most {MAX_AMOUNT} micro-credits per refund, got {amount}.",
                            maximum=MAX_AMOUNT)
    if not reason or not reason.strip():
        raise InvalidParameter("A reason is required.", field="reason")
    now = ledger_now()
    if expires_at is not None and expires_at <= now:
        raise InvalidExpiry("The expiry is in the past.", expires_at=expires_at.isoformat())
    bucket = Bucket(
        org_id=org.pk, project_id=None, kind=BucketKind.PAID, source=BucketSource.REFUND, gpu_types=[],
        effective_at=now, expires_at=expires_at, granted=amount, available=amount, reference=reference,
        reason=reason, created_by=acting_user(actor),
    )
    try:
        with transaction.atomic():
            bucket.save(force_insert=True)
    except IntegrityError:  # the reference is taken (a bucket issued before the prefix was kept)
        raise IdempotencyConflict(f"Reference {reference!r} is already used by another bucket of the org.",
                                  reference=reference) from None
    txn = post_transaction(
        org_id=org.pk,
        kind=TransactionKind.REFUND,
        key=f"refund:{reference}",
        legs=[(Account.REFUND, None, -amount), (AVAILABLE, bucket.pk, amount)],
        now=now,
        params={**params, "amount": amount, "bucket": bucket.pk},
        memo=reason,
    )
    audit(txn=txn, subject_type="ledger.bucket", subject_id=bucket.pk, actor=actor, reason=reason,
          reason_code="refund", data={**params, "bucket": bucket.pk, "reference": reference})
    funds_changed.send(sender=Bucket, org_id=org.pk)
    return bucket


@retry_on_conflict()
@transaction.atomic
def void_credits(
    *, bucket: Bucket, reason: str, key: str, amount: int | None = None, actor: Any = None,
    close: bool = False,
) -> LedgerTransaction | None:
    """Move (part of) a bucket's available credits to `void`; held credits are untouched.

    `close` also ends the bucket's validity now (its expiry moves to now), so nothing new draws on
    it and what its running jobs give back later expires with it instead of becoming spendable
    again: the release rule of DESIGN.md section 4, which the Python and the SQL paths both apply.
    Without it, credits that come back are available again (QA: a voided bucket kept paying for
    new jobs). Only a bucket in effect is closed: one not in effect yet needs no closing (nothing
    can be held on it, and its expiry cannot move before its start), one expired has ended already.
    Returns the void's transaction, or None when there was only the closing to do."""
    if amount is not None:
        check_amount(amount)
    if not reason or not reason.strip():
        raise InvalidParameter("A reason is required.", field="reason")
    (locked,) = lock_buckets([bucket.pk])
    params: dict[str, Any] = {"bucket": locked.pk, "amount": amount}
    if close:
        params["close"] = True
    txn_key = f"void:{key}"
    try:
        previous = replay(org_id=locked.org_id, key=txn_key, kind=TransactionKind.VOID, params=params)
    except IdempotencyConflict as conflict:
        raise _void_conflict(locked.org_id, txn_key, params) from conflict
    if previous is not None:
        previous.replayed = True
        return previous
    now = ledger_now()
    to_void = locked.available if amount is None else amount
    closing = close and locked.effective_at < now and (locked.expires_at is None or locked.expires_at > now)
    if to_void == 0 and not closing:
        if close and locked.closed_at is not None:
            return None  # closed already (a retry of a closing that had nothing to void): done
        raise InvalidAmount("Nothing is available to void in this bucket.")
    if to_void > locked.available:
        raise InsufficientCredits(  # QA: it said "Needs 95.00 credits", as a hold's refusal does
            needed=to_void, available=locked.available,
            detail=f"Cannot void {format_credits(to_void)} credits: only "
                   f"{format_credits(locked.available)} are available in this bucket.")
    txn = None
    if to_void:
        move_bucket(locked.pk, source="available", target="voided", amount=to_void)
        txn = post_transaction(
            org_id=locked.org_id,
            kind=TransactionKind.VOID,
            key=txn_key,
            legs=[(AVAILABLE, locked.pk, -to_void), (Account.VOID, None, to_void)],
            now=now,
            params=params,
            memo=reason,
        )
        audit(txn=txn, subject_type="ledger.bucket", subject_id=locked.pk, actor=actor, reason=reason,
              data={"close": closing})
    if closing:
        _close(locked, now=now, reason=reason, actor=actor)
    return txn


def _void_conflict(org_id: int, txn_key: str, params: dict[str, Any]) -> IdempotencyConflict:
    """Say what the key already did: the same key with another amount (the admin's form sent again
    after its amount was edited) voids nothing more, and finance must see why, not a bare key."""
    first = LedgerTransaction.objects.get(org_id=org_id, key=txn_key)
    done = first.params if first.kind == TransactionKind.VOID else {}
    if not done:
        return IdempotencyConflict(f"Key {txn_key!r} was already used for a {first.kind} transaction: "
                                   "nothing was voided.", key=txn_key, original=first.params)
    closed = ", closing it" if done.get("close") else ""
    amount = params["amount"]
    asked = "everything available" if amount is None else f"{format_credits(amount)} credits"
    if params.get("close"):
        asked += ", closing it"
    if params["bucket"] != done.get("bucket"):
        asked += f", of bucket {params['bucket']}"
    return IdempotencyConflict(
        f"This void was done already: it voided {format_credits(first.amount)} credits of bucket "
        f"{done.get('bucket')}{closed}. The same key with other terms ({asked}) voids nothing more.",
        key=txn_key, original=done, requested=params,
    )


def _close(bucket: Bucket, *, now: datetime, reason: str, actor: Any) -> None:
    """End the (locked) bucket's validity now; audited with what was still held on it."""
    Bucket.objects.filter(pk=bucket.pk).update(expires_at=now, closed_at=now,
                                                expires_at_before_close=bucket.expires_at)
    actor_type, actor_id = actor_fields(actor)
    record(action="ledger.bucket_closed", subject_type="ledger.bucket", subject_id=bucket.pk,
           org_id=bucket.org_id, actor_type=actor_type, actor_id=actor_id, reason_code="closed",
           data={"reason": reason, "held": bucket.held,
                 "expires_at_was": bucket.expires_at.isoformat() if bucket.expires_at else None})
    bucket.expires_at = now
