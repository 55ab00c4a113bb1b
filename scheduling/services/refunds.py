"""Crediting a job: finance gives back (part of) what a job, or one of its attempts, was charged.

Like a billing system's refund or credit note: the credits go back to the org as a new paid bucket
(source `refund`, no expiry unless given, reference `refund:job:<id>:<key>`), usable like any
credits, and a `JobRefund` row ties it to the job, the attempt, the amount, the reason and who
did it. The job row is locked first (lock order: idempotency record -> job -> ... -> buckets ->
audit head), then the charges and the refunds so far are re-read, so concurrent refunds of one job
never add up to more than its captures (docs/ledger.md, "Refunds"). The budgets that counted the
refunded charges get their room back (`budgets.refunds`).
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Any

from django.db import transaction

from audit.services import record
from budgets.refunds import record_refund
from config.clock import db_now
from ledger.errors import IdempotencyConflict, InvalidParameter, RefundExceedsCharges
from ledger.retry import retry_on_conflict
from ledger.services import issue_refund
from ledger.services._journal import acting_user, check_amount
from scheduling.models import JobAttempt, JobRefund
from scheduling.selectors import job_charged, job_refunded
from scheduling.services.lifecycle import lock_job

REFERENCE_MAX = 128  # Bucket.reference


def refund_reference(job_id: int, key: str) -> str:
    """`refund:job:<id>:<key>`; a key too long for a bucket reference is replaced by its hash."""
    reference = f"refund:job:{job_id}:{key}"
    if len(reference) <= REFERENCE_MAX:
        return reference
    return f"refund:job:{job_id}:sha256:{hashlib.sha256(key.encode()).hexdigest()[:40]}"


def _same(
    refund: JobRefund, amount: int, attempt_number: int | None, expires_at: datetime | None
) -> JobRefund:
    number = refund.attempt.number if refund.attempt_id else None
    # The terms of the credits too (review: another expiry was answered with the first refund), as
    # given: a bucket closed since keeps the expiry it had (review: a retry then conflicted).
    bucket = refund.bucket
    given = bucket.expires_at_before_close if bucket.closed_at is not None else bucket.expires_at
    if refund.amount != amount or number != attempt_number or given != expires_at:
        raise IdempotencyConflict(
            f"Key {refund.key!r} was already used to refund job {refund.job_id} differently.",
            key=refund.key, original={
                "amount": refund.amount, "attempt": number,
                "expires_at": given and given.isoformat()},
        )
    refund.replayed = True  # type: ignore[attr-defined]
    return refund


def _holds_to_refund(job_id: int, attempt: JobAttempt | None) -> list[int]:
    """The holds whose captures the refund gives back, in order: the attempt's it names, then the
    job's others, newest attempt first (a job refund may have taken the named attempt's already)."""
    holds = list(JobAttempt.objects.filter(job_id=job_id).order_by("-number").values_list("hold_id",
                                                                                        flat=True))
    if attempt is not None:
        holds.insert(0, attempt.hold_id)
    return list(dict.fromkeys(holds))  # once each (attempts may share a hold)


@retry_on_conflict()
@transaction.atomic
def refund_job(
    *, job_id: int, amount: int, reason: str, key: str, attempt_number: int | None = None,
    expires_at: datetime | None = None, actor: Any = None,
) -> JobRefund:
    """Refund `amount` micro-credits of what job `job_id` (or its attempt `attempt_number`) was
    charged. Idempotent by (job, key): the same request again returns the same refund with
    `replayed = True`; a different one is `IdempotencyConflict`. More than the charges less the
    refunds so far is `RefundExceedsCharges` (409)."""
    check_amount(amount)
    if not reason or not reason.strip():
        raise InvalidParameter("A reason is required.", field="reason")
    if not key or len(key) > 255:
        raise InvalidParameter("An idempotency key (1-255 characters) is required.", field="key")
    job = lock_job(job_id)
    existing = JobRefund.objects.select_related("attempt", "bucket").filter(job_id=job.pk, key=key).first()
    if existing is not None:
        return _same(existing, amount, attempt_number, expires_at)
    attempt = None
    if attempt_number is not None:
        attempt = JobAttempt.objects.filter(job_id=job.pk, number=attempt_number).first()
        if attempt is None:
            raise InvalidParameter(f"Job {job.pk} has no attempt {attempt_number}.", field="attempt")
    # Re-read under the job lock: a concurrent refund of this job committed before we got it.
    charged, refunded = job_charged(job.pk), job_refunded(job.pk)
    if amount > charged - refunded:
        raise RefundExceedsCharges(amount, max(charged - refunded, 0), charged=charged, refunded=refunded,
                                   what=f"job {job.pk}")
    if attempt is not None:
        charged, refunded = job_charged(job.pk, attempt_number=attempt_number), job_refunded(
            job.pk, attempt_number=attempt_number)
        if amount > charged - refunded:
            raise RefundExceedsCharges(amount, max(charged - refunded, 0), charged=charged,
                                       refunded=refunded, what=f"attempt {attempt_number} of job {job.pk}")
    params = {"job": job.pk, "attempt": attempt_number, "key": key}
    reference = refund_reference(job.pk, key)
    credited = record_refund(org_id=job.org_id, hold_ids=_holds_to_refund(job.pk, attempt), amount=amount,
                             reference=reference)  # budget periods are locked before the buckets
    bucket = issue_refund(org=job.org, amount=amount, reference=reference, reason=reason,
                          params=params, expires_at=expires_at, actor=actor)
    for budget_id, credited_amount in sorted(credited.items()):
        record(action="budget.refund_credited", subject_type="budget", subject_id=budget_id,
               org_id=job.org_id, amount=credited_amount, reason_code="refund",
               actor_type="user" if actor is not None else "system",
               actor_id=str(actor.pk) if actor is not None else "", data={**params, "reference": reference})
    refund = JobRefund.objects.create(
        job=job, attempt=attempt, org_id=job.org_id, bucket=bucket, amount=amount, reason=reason, key=key,
        created_at=db_now(), created_by=acting_user(actor),
    )
    refund.replayed = False  # type: ignore[attr-defined]
    return refund
