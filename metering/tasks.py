"""Metering Celery tasks: thin, idempotent, acks_late wrappers around the sweep services.

Every one is safe to run twice at once (SKIP LOCKED claims, keyed captures, the hold state
machine), so a redelivery after a worker crash (acks_late) or an overlapping beat changes nothing.
"""

from __future__ import annotations

from celery import shared_task


@shared_task(acks_late=True, ignore_result=True)
def charge_progress() -> dict[str, int]:
    """Capture running attempts' usage; extend holds nearing their end, or stop out_of_credit."""
    from metering.sweeps import charge_running

    return charge_running()


@shared_task(acks_late=True, ignore_result=True)
def release_stranded_holds() -> dict[str, int]:
    from metering.sweeps import release_stranded_holds as sweep

    return sweep()


@shared_task(acks_late=True, ignore_result=True)
def expire_buckets() -> int:
    from metering.sweeps import expire_buckets as sweep

    return sweep()


@shared_task(acks_late=True, ignore_result=True)
def reconcile() -> dict[str, int]:
    from metering.sweeps import reconcile as run

    return run().counts()
