"""Reason codes and the one time format used in wait details."""

from __future__ import annotations

from scheduling.core import reasons as R


def test_wait_detail_times_are_iso_utc_rounded_up_to_the_second() -> None:
    assert R.utc_time(0.0) == "1970-01-01T00:00:00Z"
    assert R.utc_time(1_795_304_434.0) == "2026-11-21T23:40:34Z"
    # A "not before" time is never shown earlier than it is.
    assert R.utc_time(1_795_304_433.2) == "2026-11-21T23:40:34Z"
