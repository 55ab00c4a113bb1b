"""Reason codes and the one time format used in wait details."""

from __future__ import annotations

import re
from pathlib import Path

from scheduling.core import reasons as R

SCHEDULER_DOC = Path(__file__).resolve().parents[3] / "docs" / "scheduler.md"


def test_wait_detail_times_are_iso_utc_rounded_up_to_the_second() -> None:
    assert R.utc_time(0.0) == "1970-01-01T00:00:00Z"
    assert R.utc_time(1_795_304_434.0) == "2026-11-21T23:40:34Z"
    # A "not before" time is never shown earlier than it is.
    assert R.utc_time(1_795_304_433.2) == "2026-11-21T23:40:34Z"


def test_every_wait_reason_has_a_row_in_the_documented_table() -> None:
    """Codes are part of the API contract: each one a job can wait with is in docs/scheduler.md,
    including `backoff`, which the lifecycle (not the core) sets after a lost node."""
    assert R.BACKOFF == "backoff" and R.is_wait_reason(R.BACKOFF)
    table = SCHEDULER_DOC.read_text().split("## Reason codes", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", table, flags=re.MULTILINE))
    assert R.WAIT_REASONS - documented == set()
