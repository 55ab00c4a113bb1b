"""Scheduler Celery tasks: thin, idempotent, acks_late wrappers around the tick services.

Running any of them twice at once is safe: a pass runs under the leader lock (a second one returns
at once), node moves and attempt ends are conditional updates.
"""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.core.cache import cache
from django.db import transaction

logger = logging.getLogger(__name__)

SOON_KEY = "scheduling:pass-soon"


@shared_task(acks_late=True, ignore_result=True)
def scheduler_tick(trigger: str = "beat") -> int | None:
    """One scheduling pass; returns the SchedulerPass id, or None if another leader was running."""
    from scheduling.services.tick import run_scheduling_pass

    row = run_scheduling_pass(trigger=trigger)
    return row.pk if row is not None else None


@shared_task(acks_late=True, ignore_result=True)
def sweep_nodes() -> dict[str, int]:
    """Silent nodes -> unknown -> down; their attempts end as lost (and are requeued)."""
    from scheduling.services.tick import sweep_nodes as sweep

    return sweep()


@shared_task(acks_late=True, ignore_result=True)
def fund_waiting_jobs() -> int:
    """Retry the hold of requeued jobs that could not be funded (they wait with reason `budget`)."""
    from scheduling.services.lifecycle import fund_waiting_jobs as fund

    return fund()


@shared_task(acks_late=True, ignore_result=True)
def retry_org_funding(org_id: int) -> int:
    """Money arrived for an org (credits, a budget): retry its unfunded jobs and refused top-ups now."""
    from scheduling.services.lifecycle import retry_funding_of

    return retry_funding_of(org_id=org_id)


@shared_task(acks_late=True, ignore_result=True)
def cancel_orphaned_dependents() -> int:
    """Cancel queued afterok jobs whose dependency ended unsuccessfully (backstop of the cascade)."""
    from scheduling.services.lifecycle import cancel_orphaned_dependents as sweep

    return sweep()


def schedule_soon(*, trigger: str = "soon") -> None:
    """Ask for an early pass once the current transaction commits (submission, finish, cancel).

    A burst coalesces into one pass: the first caller sets a short-lived cache key and sends the
    task; the others see the key and rely on that pass (or the next beat tick).
    """

    def send() -> None:
        window = float(getattr(settings, "SCHEDULER_SOON_COALESCE_SECONDS", 1.0))
        try:
            if cache.add(SOON_KEY, 1, timeout=max(1, round(window))):
                scheduler_tick.apply_async(kwargs={"trigger": trigger}, countdown=window / 2)
        except Exception:
            # The change is committed; an early pass is only an optimisation (the beat tick
            # will run it), so a broker or cache outage must not turn success into an error.
            logger.warning("could not trigger an early scheduling pass", exc_info=True)

    transaction.on_commit(send)
