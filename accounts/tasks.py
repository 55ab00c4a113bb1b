"""Periodic accounts tasks (thin wrappers around services)."""

from celery import shared_task

from accounts.services import reap_idempotency_records


@shared_task(acks_late=True, ignore_result=True)
def reap_idempotency_keys() -> int:
    """Delete idempotency records past their expiry (kept >= IDEMPOTENCY_KEY_TTL_SECONDS)."""
    total = 0
    while (deleted := reap_idempotency_records(limit=5000)) > 0:
        total += deleted
    return total
