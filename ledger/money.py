"""The one formatting of money for people: int micro-credits -> a credits string (the portal's
`credits` filter and the admin's statement both use it)."""

from __future__ import annotations

from ledger.models import MICRO


def format_credits(micro: int | None) -> str:
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
