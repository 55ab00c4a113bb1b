"""Review of 2c4bda3: the trial extensions (`_most_payable`) leave nothing behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.models import MICRO, Bucket, Hold, LedgerTransaction
from ledger.verification import verify_ledger
from metering.heartbeats import HeartbeatItem
from metering.services import ingest_heartbeats, settle_attempt
from scheduling.models import GpuType, JobAttempt
from tests.metering.conftest import World


def _event(a: JobAttempt) -> Any:
    from audit.models import AuditEvent

    return AuditEvent.objects.get(action="metering.attempt_settled", subject_id=a.pk)


def test_probes_leave_no_alert_charge_journal_or_metric_behind(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt],
    django_capture_on_commit_callbacks: Any,
) -> None:
    from audit.models import AuditEvent
    from audit.verification import verify_chains
    from budgets.models import BudgetCharge, BudgetPeriod
    from budgets.services import set_budget
    from config import metrics

    funded(100 * MICRO)
    a = make_attempt(hold_amount=1 * MICRO)
    # A soft project budget every extension crosses, a hard org one with room for 2 of the 4.
    set_budget(org=world.org, project=world.project, period="month", limit=1, enforcement="soft")
    set_budget(org=world.org, period="month", limit=3 * MICRO, enforcement="hard")
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    alerts = AuditEvent.objects.filter(action="budget.soft_limit_exceeded").count()
    charges = BudgetCharge.objects.count()
    ext = metrics.HOLD_EVENTS.labels("extended")._value.get()
    moved = metrics.LEDGER_MICROCREDITS.labels("extend")._value.get()
    with django_capture_on_commit_callbacks(execute=True):
        hold = settle_attempt(attempt=a, outcome="completed")
    paid = _event(a).data["extended_at_settlement"]
    assert 2 * MICRO - 4 * MICRO // 100 <= paid <= 2 * MICRO
    assert hold.captured == 1 * MICRO + paid
    # one final extension: one journal entry, one soft alert, one metric bump
    assert LedgerTransaction.objects.filter(hold_id=hold.pk, kind="extend").count() == 1
    assert AuditEvent.objects.filter(action="budget.soft_limit_exceeded").count() == alerts + 1
    assert BudgetCharge.objects.count() == charges
    assert metrics.HOLD_EVENTS.labels("extended")._value.get() == ext + 1
    assert metrics.LEDGER_MICROCREDITS.labels("extend")._value.get() == moved + paid
    for p in BudgetPeriod.objects.all():
        assert (p.held, p.spent) == (0, hold.captured)
    assert verify_ledger() == []
    assert verify_chains() == []


def test_a_probe_that_narrows_the_hold_is_undone_and_the_final_narrows_it(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    from ledger.services import place_hold

    GpuType.objects.create(name="A100", memory_gb=80)
    funded(1 * MICRO)  # unrestricted: all of it on the hold
    restricted = funded(2 * MICRO, gpu_types=("H100",))
    hold = place_hold(org=world.org, amount=1 * MICRO, key="two-types", project=world.project,
                      user=world.user, gpu_types=["A100", "H100"], reference="job:two")
    a = make_attempt(hold=hold)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    settled = settle_attempt(attempt=a, outcome="completed")
    assert 3 * MICRO - 4 * MICRO // 100 <= settled.captured <= 3 * MICRO
    assert Hold.objects.get(pk=hold.pk).gpu_types == ["H100"]
    assert Bucket.objects.get(pk=restricted.pk).spent == settled.captured - 1 * MICRO
    assert verify_ledger() == []


def test_cost_of_settling_an_overrun_of_a_broke_org(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    funded(1 * MICRO)
    a = make_attempt(hold_amount=1 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    with CaptureQueriesContext(connection) as q:
        settle_attempt(attempt=a, outcome="completed")
    savepoints = sum(1 for x in q.captured_queries if x["sql"].startswith("SAVEPOINT"))
    print(f"\nbroke org: {len(q.captured_queries)} queries, {savepoints} savepoints")
    assert _event(a).data["unfunded"] == 4 * MICRO
