"""Budget periods: which period of a budget contains an instant (pure functions, no ORM)."""

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from config.months import month_bounds

__all__ = ["current_bounds", "month_bounds", "period_bounds"]


def period_bounds(
    *, period: str, window_start: datetime | None, window_end: datetime | None, now: datetime
) -> tuple[datetime, datetime] | None:
    """[start, end) of the period containing `now`, or None when a fixed window does not cover it."""
    if period == "month":
        return month_bounds(now)
    assert window_start is not None and window_end is not None
    if window_start <= now < window_end:
        return window_start, window_end
    return None


def current_bounds(budgets: Iterable[Any], now: datetime) -> dict[int, tuple[datetime, datetime]]:
    """Budget id -> [start, end) of each budget's period containing `now`; a window that does not
    cover `now` is left out. A budget's current period row is the one starting there: a budget
    redefined keeps its old definition's rows, and one may still span `now`."""
    spans = {}
    for budget in budgets:
        span = period_bounds(period=budget.period, window_start=budget.window_start,
                             window_end=budget.window_end, now=now)
        if span is not None:
            spans[budget.pk] = span
    return spans
