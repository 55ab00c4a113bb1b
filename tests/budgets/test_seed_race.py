"""A budget set mid-period while a running job captures from a hold of its scope, on two real
connections: the capture waits for the seeding (which locks the scope's active holds), then moves
the new charge, so the period ends up counting exactly what happened (review: the capture slipped
in after the seeding read the hold, found no charge to move, and left a phantom 'held' behind)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from budgets.models import BudgetCharge, BudgetPeriod
from budgets.services import record_capture, set_budget
from ledger.locks import lock_hold
from ledger.services import capture, place_hold
from tests.api.factories import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_capture_racing_the_seeding_is_counted_once(monkeypatch: pytest.MonkeyPatch) -> None:
    tenant = make_tenant(funds=10_000)
    hold = place_hold(org=tenant.org, amount=100, key="running", project=tenant.project, user=tenant.user)
    threads: list[threading.Thread] = []

    def charge_progress() -> None:  # what metering does: lock the hold, count it in budgets, capture
        try:
            with transaction.atomic():
                locked = lock_hold(hold.pk)
                record_capture(hold=locked, amount=30)
                capture(hold=locked, amount=30, key="progress")
        finally:
            connection.close()

    create = BudgetCharge.objects.bulk_create

    def capture_after_the_reads(charges: list, **kw: object) -> list:  # the seeding has read the holds
        thread = threading.Thread(target=charge_progress)
        thread.start()
        threads.append(thread)
        time.sleep(0.5)  # unlocked, the capture commits now, before the seeding's charge exists
        return create(charges, **kw)

    monkeypatch.setattr(BudgetCharge.objects, "bulk_create", capture_after_the_reads)
    budget, _ = set_budget(org=tenant.org, period="month", limit=1000, enforcement="hard")
    for thread in threads:
        thread.join(timeout=30)
    assert len(threads) == 1 and not threads[0].is_alive()
    period = BudgetPeriod.objects.get(budget=budget)
    assert (period.held, period.spent) == (70, 30)
    assert list(BudgetCharge.objects.values_list("held", "spent")) == [(70, 30)]
