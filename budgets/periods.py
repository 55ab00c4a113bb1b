"""Budget periods: which period of a budget contains an instant (pure functions, no ORM)."""

from datetime import datetime

from config.months import month_bounds

__all__ = ["month_bounds", "period_bounds"]


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
