"""Template filters: `credits` (`ledger.money.format_credits`: int micro-credits -> credits) and
`span` (seconds or a timedelta as days, hours, minutes)."""

from datetime import timedelta

from django import template

from ledger.money import format_credits

register = template.Library()


@register.filter(name="credits")
def credits(micro: int | None) -> str:
    """Exact, at least two decimals, never rounded: 1_234_500_000 -> "1,234.50"."""
    return format_credits(micro)


@register.filter(name="span")
def span(seconds: float | int | timedelta | None) -> str:
    """A duration as people read it: 93784 -> "1 d 2 h 3 min", 61 -> "1 min 1 s"."""
    if seconds is None:
        return "—"
    total = int(seconds.total_seconds() if isinstance(seconds, timedelta) else seconds)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min")] + ([(secs, "s")] if days == hours == 0 else [])
    shown = [f"{n} {unit}" for n, unit in parts if n]
    return " ".join(shown) or "0 s"
