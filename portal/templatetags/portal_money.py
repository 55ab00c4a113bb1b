"""The one formatting helper for money: int micro-credits -> a credits string."""

from django import template

register = template.Library()

MICRO = 1_000_000


@register.filter(name="credits")
def credits(micro: int | None) -> str:
    """Format micro-credits exactly: 1_234_500_000 -> "1,234.50"; 1_500 -> "0.0015".

    Integer arithmetic only (no floats near money); at least two decimals, trailing zeros
    beyond that trimmed, never rounded.
    """
    if micro is None:
        return "—"
    value = int(micro)
    sign = "-" if value < 0 else ""
    whole, frac = divmod(abs(value), MICRO)
    decimals = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{sign}{whole:,}.{decimals}"
