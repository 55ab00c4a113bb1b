"""The `credits` template filter: `ledger.money.format_credits` (int micro-credits -> credits)."""

from django import template

from ledger.money import format_credits

register = template.Library()


@register.filter(name="credits")
def credits(micro: int | None) -> str:
    """Exact, at least two decimals, never rounded: 1_234_500_000 -> "1,234.50"."""
    return format_credits(micro)
