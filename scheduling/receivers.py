"""What the scheduler does when other apps say something changed."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import receiver

from ledger.signals import funds_changed

log = logging.getLogger("scheduling")


@receiver(funds_changed, dispatch_uid="scheduling-retry-funding")
def retry_funding_soon(sender: Any, *, org_id: int, **_kwargs: Any) -> None:
    """Once the change commits, the org's jobs waiting for funds are tried again at once, not at
    their next funding retry (QA: a job refused for a budget waited up to two minutes after the
    budget was raised, still quoting the old limit)."""
    transaction.on_commit(lambda: _retry(org_id))


def _retry(org_id: int) -> None:
    from config.clock import db_now
    from scheduling.core import reasons
    from scheduling.models import Job, JobState
    from scheduling.services.lifecycle import funding_retry_at
    from scheduling.tasks import fund_waiting_jobs, schedule_soon

    now = db_now()
    queued = Job.objects.filter(org_id=org_id, state=JobState.QUEUED)
    # A refusal's retry time, not a longer backoff (a lost node's) that the refusal kept.
    queued.filter(current_hold__isnull=True, wait_reason=reasons.BUDGET, not_before__gt=now,
                  not_before__lte=funding_retry_at(now)).update(not_before=now)
    queued.filter(price_capped_until__gt=now).update(price_capped_until=now)  # a refused top-up
    try:
        fund_waiting_jobs.delay()
    except Exception:  # committed already; the beat task retries within a minute anyway
        log.warning("could not ask for an early funding retry", exc_info=True)
    schedule_soon(trigger="funds")
