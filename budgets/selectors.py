"""Budget reads."""

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Q

from budgets.models import Budget, BudgetPeriod
from budgets.periods import period_bounds
from config.clock import db_now


def current_period(budget: Budget, now: datetime | None = None) -> BudgetPeriod | None:
    """The consumption row of the period containing `now` (an empty one if nothing counted yet)."""
    return current_periods([budget], now)[budget.pk]


def current_periods(budgets: Iterable[Budget], now: datetime | None = None) -> dict[int, BudgetPeriod | None]:
    """`current_period` of each budget, by budget id, in one query (a list page's worth).

    The row is the one that starts where the budget's current bounds start: a budget whose period
    or window was redefined keeps its old definition's rows, and one of them may still span now
    (QA: the admin, which took any row spanning now, showed the old month's figures after a
    change to a window). None: a window that does not cover now."""
    now = now or db_now()
    bounds: dict[int, tuple[datetime, datetime] | None] = {}
    by_id: dict[int, Budget] = {}
    for budget in budgets:
        by_id[budget.pk] = budget
        bounds[budget.pk] = period_bounds(period=budget.period, window_start=budget.window_start,
                                          window_end=budget.window_end, now=now)
    match = Q()
    for budget_id, span in bounds.items():
        if span is not None:
            match |= Q(budget_id=budget_id, starts_at=span[0])
    found = {row.budget_id: row for row in BudgetPeriod.objects.filter(match)} if match else {}
    periods: dict[int, BudgetPeriod | None] = {}
    for budget_id, span in bounds.items():
        if span is None:
            periods[budget_id] = None
            continue
        budget = by_id[budget_id]
        periods[budget_id] = found.get(budget_id) or BudgetPeriod(
            budget=budget, org_id=budget.org_id, starts_at=span[0], ends_at=span[1])
    return periods
