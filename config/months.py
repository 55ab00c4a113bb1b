"""Calendar months in UTC (pure): the period of month budgets and of monthly statements."""

from datetime import UTC, datetime


def month_bounds(now: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) containing `now`, as [start, end)."""
    now = now.astimezone(UTC)
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    end = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    return start, end
