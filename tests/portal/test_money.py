"""The one money formatting helper: exact, integer-only."""

import pytest

from portal.templatetags.portal_money import credits


@pytest.mark.parametrize(
    ("micro", "shown"),
    [
        (0, "0.00"),
        (1_000_000, "1.00"),
        (1_234_500_000, "1,234.50"),
        (12_345_678, "12.345678"),
        (1_500, "0.0015"),
        (1, "0.000001"),
        (-2_500_000, "-2.50"),
        (None, "—"),
    ],
)
def test_credits_formats_micro_credits_exactly(micro: int | None, shown: str) -> None:
    assert credits(micro) == shown
