"""A window budget set before its window begins is counted from its scope's activity when the
window begins (`open_started_windows`, beat), as if it had been set then (QA: holds placed before
the start went on capturing inside the window uncounted, so a hard limit could be overspent)."""

import time
from datetime import datetime, timedelta

import pytest
from django.db import transaction

from audit.models import AuditEvent
from budgets.errors import BudgetBeingSet, BudgetExceeded, WindowOpening
from budgets.models import Budget, BudgetPeriod
from budgets.services import open_started_windows, record_extension, reserve_budgets, set_budget
from budgets.tasks import open_budget_windows
from config.clock import db_now
from ledger.services import capture, place_hold
from tests.api.factories import make_tenant

pytestmark = pytest.mark.django_db(transaction=True)  # real commits: the window begins in real time


def _window_in_a_second(enforcement: str, length: timedelta) -> tuple[dict, Budget, datetime]:
    """A member's window budget of 1,000 set now, beginning a second from now: (scope, budget, start)."""
    tenant = make_tenant(funds=10_000)
    member = {"org": tenant.org, "project": tenant.project, "user": tenant.user}
    start = db_now() + timedelta(seconds=1)
    budget, _ = set_budget(**member, period="window", limit=1_000, enforcement=enforcement,
                           window_start=start, window_end=start + length)
    return member, budget, start


def _wait_until(moment: datetime) -> None:
    while db_now() <= moment:
        time.sleep(0.05)


def test_holds_placed_before_the_window_count_in_it_once_it_begins() -> None:
    member, budget, start = _window_in_a_second("hard", timedelta(hours=2))
    assert Budget.objects.get(pk=budget.pk).window_opened is False
    assert open_started_windows() == 0  # not begun: nothing to count yet
    early = place_hold(amount=700, key="early", **member)  # before the window: no period yet
    reserve_budgets(hold=early, amount=700, **member)
    assert not BudgetPeriod.objects.filter(budget=budget).exists()
    ended = place_hold(amount=50, key="ended", **member)
    capture(hold=ended, amount=50, key="before")  # captured before the window: not in it

    _wait_until(start)
    capture(hold=early, amount=200, key="inside")  # inside the window, by a pre-window hold
    assert open_budget_windows() == 1  # the beat task
    period = BudgetPeriod.objects.get(budget=budget)
    assert (period.held, period.spent) == (500, 200)  # as a budget set now would start
    assert Budget.objects.get(pk=budget.pk).window_opened is True
    event = AuditEvent.objects.get(action="budget.window_opened", subject_id=str(budget.pk))
    assert (event.data["held"], event.data["spent"]) == (500, 200)
    assert open_started_windows() == 0  # once

    late = place_hold(amount=400, key="late", **member)
    with pytest.raises(BudgetExceeded) as refused, transaction.atomic():
        reserve_budgets(hold=late, amount=400, **member)
    assert refused.value.used == 700  # 500 held + 200 spent: 400 more would cross 1,000


def test_a_period_made_by_a_submission_before_the_opening_is_counted_afresh() -> None:
    """A submission in the seconds between the start and the beat task makes the period row and
    counts only its own hold; the opening recounts it from the scope, that hold included, once."""
    member, budget, start = _window_in_a_second("soft", timedelta(hours=2))
    early = place_hold(amount=300, key="early", **member)
    _wait_until(start)
    first = place_hold(amount=100, key="first", **member)
    reserve_budgets(hold=first, amount=100, **member)
    assert BudgetPeriod.objects.get(budget=budget).held == 100  # early not counted yet
    assert open_started_windows() == 1
    period = BudgetPeriod.objects.get(budget=budget)
    assert period.held == 400 and sorted(period.charges.values_list("hold_id", "held")) == sorted(
        [(early.pk, 300), (first.pk, 100)])


def test_budgets_set_inside_or_not_windows_are_open_at_once() -> None:
    tenant = make_tenant(funds=10_000)
    now = db_now()
    month, _ = set_budget(org=tenant.org, period="month", limit=10, enforcement="hard")
    inside, _ = set_budget(org=tenant.org, project=tenant.project, period="window", limit=10,
                           enforcement="hard", window_start=now - timedelta(hours=1),
                           window_end=now + timedelta(hours=1))
    assert Budget.objects.filter(pk__in=[month.pk, inside.pk], window_opened=True).count() == 2
    # Moved to a later window: closed again until it begins; back to a month: open.
    later, _ = set_budget(org=tenant.org, project=tenant.project, period="window", limit=10,
                          enforcement="hard", window_start=now + timedelta(days=1),
                          window_end=now + timedelta(days=2))
    assert Budget.objects.get(pk=later.pk).window_opened is False
    set_budget(org=tenant.org, project=tenant.project, period="month", limit=10, enforcement="hard")
    assert Budget.objects.get(pk=later.pk).window_opened is True


def test_a_hard_window_refuses_new_holds_until_it_is_counted() -> None:
    """Review: in the seconds (or, beat down, hours) between the start and the opening, a hard
    window checked new holds against a count without the holds placed before the start."""
    member, budget, start = _window_in_a_second("hard", timedelta(hours=2))
    early = place_hold(amount=700, key="early", **member)
    _wait_until(start)
    late = place_hold(amount=500, key="late", **member)
    with pytest.raises(WindowOpening) as refused, transaction.atomic():
        reserve_budgets(hold=late, amount=500, **member)
    assert isinstance(refused.value, BudgetBeingSet) and refused.value.retry_after == 5
    # An extension of a running hold is not refused: the opening recounts it with the rest.
    record_extension(hold=early, amount=100)
    assert open_started_windows() == 1
    period = BudgetPeriod.objects.get(budget=budget)
    # Recounted from the holds: early's 700 and late's 500 (placed, though its budget check was
    # refused); the 100 counted by the extension alone (no ledger extension here) is replaced.
    assert (period.held, period.spent) == (1_200, 0)
    later = place_hold(amount=10, key="later", **member)
    with pytest.raises(BudgetExceeded), transaction.atomic():
        reserve_budgets(hold=later, amount=10, **member)  # now checked against the real count


def test_a_window_that_ended_before_its_opening_says_it_was_not_counted() -> None:
    member, budget, start = _window_in_a_second("soft", timedelta(seconds=1))
    _wait_until(start)
    inside = place_hold(amount=100, key="inside", **member)
    reserve_budgets(hold=inside, amount=100, **member)  # soft: counted alone meanwhile
    _wait_until(start + timedelta(seconds=1))
    assert open_started_windows() == 1
    event = AuditEvent.objects.get(action="budget.window_opened", subject_id=str(budget.pk))
    assert (event.reason_code, event.data["counted"], event.data["held"]) == ("window_ended", False, 100)
    assert Budget.objects.get(pk=budget.pk).window_opened is True
