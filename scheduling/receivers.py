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
    budget was raised, still quoting the old limit). Only a task is sent here, and a failure to
    send is logged: the change has committed, and nothing after it may fail its caller (review:
    the job updates, run here, deadlocked with a pass and turned a fresh credit issue into a
    retried "already issued")."""
    transaction.on_commit(lambda: _send(org_id), robust=True)


def _send(org_id: int) -> None:
    from scheduling.tasks import retry_org_funding

    try:
        retry_org_funding.delay(org_id)
    except Exception:  # the beat's funding retry comes within a minute anyway
        log.warning("could not ask for an early funding retry of org %s", org_id, exc_info=True)
