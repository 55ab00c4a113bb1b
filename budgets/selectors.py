"""Budget reads."""

from collections.abc import Iterable
from datetime import datetime

from django.db.models import Q

from budgets.models import Budget, BudgetPeriod
from budgets.periods import current_bounds
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
    budgets = list(budgets)
    bounds = current_bounds(budgets, now or db_now())
    found = {row.budget_id: row for row in BudgetPeriod.objects.filter(starting_at(bounds))} if bounds else {}
    periods: dict[int, BudgetPeriod | None] = {}
    for budget in budgets:
        span = bounds.get(budget.pk)
        periods[budget.pk] = None if span is None else found.get(budget.pk) or BudgetPeriod(
            budget=budget, org_id=budget.org_id, starts_at=span[0], ends_at=span[1])
    return periods


def starting_at(bounds: dict[int, tuple[datetime, datetime]]) -> Q:
    """The period rows of these budgets (by id) that start where their bounds start."""
    match = Q()
    for budget_id, (starts, _ends) in bounds.items():
        match |= Q(budget_id=budget_id, starts_at=starts)
    return match
