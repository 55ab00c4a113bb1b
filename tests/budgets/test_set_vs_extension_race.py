"""A budget redefined while a running job extends its hold, on real connections (review).

Setting a budget locked the budget row FOR UPDATE, then (a new period definition) the scope's active
holds. An extension holds its hold and, the first activity of a period, inserts the period's row,
whose deferred foreign key takes FOR KEY SHARE on the budget row at commit: hold -> budget row
against budget row -> hold, a deadlock (both callers retried on 40P01, a stall and sometimes a
whole scheduling pass rolled back). The budget row is now locked FOR NO KEY UPDATE, which a key
share does not wait for. Failed before."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import transaction

from budgets.models import BudgetCharge, BudgetPeriod
from budgets.services import record_extension, set_budget
from config.clock import db_now
from ledger.locks import lock_hold
from ledger.services import extend_hold, place_hold
from tests.api.factories import make_tenant
from tests.lock_waits import another_session_waits
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def test_redefining_a_budget_while_a_running_job_extends_its_hold_does_not_deadlock() -> None:
    tenant = make_tenant(funds=10_000)
    budget, _ = set_budget(org=tenant.org, period="month", limit=100_000, enforcement="hard")
    hold = place_hold(org=tenant.org, amount=100, key="running", project=tenant.project, user=tenant.user)
    BudgetPeriod.objects.filter(budget=budget).delete()  # a new month: its period row is not there yet
    hold_locked = threading.Event()
    window_starts = []
    setting_waited = []

    def extension() -> None:  # as metering.charging: the hold, then budgets, then the ledger
        with transaction.atomic():
            locked = lock_hold(hold.pk)
            hold_locked.set()
            # The setting now holds the budget row and waits for this hold.
            setting_waited.append(another_session_waits(redefining.done))
            record_extension(hold=locked, amount=50)
            extend_hold(hold=locked, amount=50, key="attempt:1:extend:100")

    def redefine() -> None:  # finance: the month becomes a window
        assert hold_locked.wait(10)
        now = db_now()
        window_starts.append(now - timedelta(days=1))
        set_budget(org=tenant.org, period="window", limit=100_000, enforcement="hard",
                   window_start=now - timedelta(days=1), window_end=now + timedelta(days=1))

    redefining = Worker(redefine)
    extending = Worker(extension).start()
    redefining.start()
    extending.join(), redefining.join()
    assert extending.errors == redefining.errors == []
    assert setting_waited == [True], "the setting did not wait for the extension's hold: no race"
    window = BudgetPeriod.objects.get(budget=budget, starts_at=window_starts[0])
    # The setting waited for the extension, and its seeding counted the grown hold.
    assert window.held == 150
    assert BudgetCharge.objects.filter(hold_id=hold.pk, period=window).get().held == 150
