"""Budget reads."""

from datetime import datetime

from budgets.models import Budget, BudgetPeriod
from budgets.periods import period_bounds
from config.clock import db_now


def current_period(budget: Budget, now: datetime | None = None) -> BudgetPeriod | None:
    """The consumption row of the period containing `now` (an empty one if nothing counted yet)."""
    now = now or db_now()
    bounds = period_bounds(period=budget.period, window_start=budget.window_start,
                           window_end=budget.window_end, now=now)
    if bounds is None:
        return None
    found = BudgetPeriod.objects.filter(budget=budget, starts_at=bounds[0]).first()
    return found or BudgetPeriod(budget=budget, org_id=budget.org_id, starts_at=bounds[0], ends_at=bounds[1])
