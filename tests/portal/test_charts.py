"""Stacked-bar geometry: proportional, integer, always spanning the full width."""

from portal.charts import SCALE, stacked_bar


def test_segments_are_proportional_and_fill_the_bar() -> None:
    segments = stacked_bar([("available", "Available", 3), ("held", "Held", 0), ("spent", "Spent", 1)])
    assert [(s.key, s.x, s.width) for s in segments] == [("available", 0, 7500), ("spent", 7500, 2500)]


def test_rounding_leftover_goes_to_the_last_segment() -> None:
    segments = stacked_bar([("a", "A", 1), ("b", "B", 1), ("c", "C", 1)])
    assert [s.width for s in segments] == [3333, 3333, 3334]
    assert sum(s.width for s in segments) == SCALE


def test_nothing_to_draw() -> None:
    assert stacked_bar([("a", "A", 0)]) == []
