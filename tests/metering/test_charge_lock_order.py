"""A charge tick that captures and then extends a hold takes its budget periods and buckets ahead
(review of the settlement's overrun extension, which found the same fault here): the capture
locked the periods the hold counts in, its buckets and the org's audit chain head, then the
extension the current periods and the org's eligible buckets. Across a month's end the current
period was locked after buckets and the head, so a submission of the new month (current period,
then buckets) deadlocked with it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction

from ledger.models import MICRO
from metering.charging import Action, charge_progress
from metering.heartbeats import HeartbeatItem
from metering.services import ingest_heartbeats
from scheduling.models import JobAttempt
from tests.metering.conftest import World
from tests.metering.test_requeue_lock_order import _wait_for
from tests.metering.test_settlement_lock_order import _roll_the_month_over, hold_the_org_audit_head
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_charge_that_extends_after_a_month_boundary_does_not_deadlock_with_a_submission(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt], submit: Callable[..., Any]
) -> None:
    from budgets.services import set_budget

    funded(100 * MICRO)
    # Below its look-ahead once it captures: the charge captures, then extends.
    extending = make_attempt(hold_amount=300_000, started_ago=5, gpus=(0, 1))
    set_budget(org=world.org, period="month", limit=1_000 * MICRO, enforcement="hard")  # counts it
    _roll_the_month_over(world.org.pk)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(extending.pk, 1, 8_000)])


    def charge() -> Any:
        with transaction.atomic():  # no retry: show the conflict
            return charge_progress(attempt=extending)

    def submission() -> Any:
        with transaction.atomic():  # no retry either
            return submit(gpus=1, max_wall_seconds=600)

    blocker, release = hold_the_org_audit_head(world.org.pk)
    first = Worker(charge).start()  # captures: last month's period, the bucket; waits for the head
    assert _wait_for(1)
    second = Worker(submission).start()  # this month's period, then waits for the bucket
    assert _wait_for(2)
    release.set()
    for w in (blocker, first, second):
        w.join()
    errors = [repr(e) for w in (first, second) for e in w.errors]
    assert errors == [], errors
    assert Action.EXTENDED in first.result.actions and Action.CAPTURED in first.result.actions
