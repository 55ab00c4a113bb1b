"""Server-side chart geometry for inline SVG (no JavaScript, integer maths only)."""

from dataclasses import dataclass

# The SVG viewBox is SCALE units wide, so widths are integer fractions of 10,000 (basis points).
SCALE = 10_000


@dataclass(frozen=True)
class Segment:
    """One coloured part of a stacked bar."""

    key: str  # css class suffix and legend key, e.g. "available"
    label: str
    amount: int  # micro-credits
    x: int
    width: int


def stacked_bar(parts: list[tuple[str, str, int]]) -> list[Segment]:
    """Lay out (key, label, amount) parts left to right, proportional to their amounts.

    Rounding leftovers go to the last non-empty part so the bar always spans the full width.
    """
    total = sum(max(amount, 0) for _, _, amount in parts)
    if total <= 0:
        return []
    segments: list[Segment] = []
    x = 0
    visible = [(key, label, amount) for key, label, amount in parts if amount > 0]
    for index, (key, label, amount) in enumerate(visible):
        width = SCALE - x if index == len(visible) - 1 else amount * SCALE // total
        segments.append(Segment(key=key, label=label, amount=amount, x=x, width=width))
        x += width
    return segments
