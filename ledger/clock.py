"""The ledger's clock: the database's `now()` (DESIGN.md §8), with a test-only offset.

Production never sets the offset. Tests use `shifted(delta)` to run expiry, holds and releases
"as of" a later instant without sleeping; every ledger decision reads the time from here.
"""

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from config.clock import db_now, db_wall_clock

_offset = timedelta(0)


def ledger_now() -> datetime:
    """The database clock of the current transaction (plus the test offset, zero in production)."""
    return db_now() + _offset


@contextmanager
def shifted(delta: timedelta) -> Iterator[None]:
    """Test helper: move the ledger clock forward by `delta` inside the block."""
    global _offset
    previous = _offset
    _offset = previous + delta
    try:
        yield
    finally:
        _offset = previous


def ledger_time(db_value: datetime) -> datetime:
    """The ledger clock for a DB clock value already read in this transaction (saves a query)."""
    return db_value + _offset


def clock_offset() -> timedelta:
    """The test offset (zero in production), for SQL that computes `now() + offset` itself."""
    return _offset


def expiry_clock(expiries: Iterable[datetime | None], now: datetime) -> datetime:
    """The instant to judge "expired" by for buckets locked (and re-read) in this transaction,
    given their `expires_at` and the transaction's ledger `now` (ADR 0012): `now`, or, when one of
    them ends after it, the database's wall clock read now. Whatever committed before the locks
    were granted (an expiry sweep, a close) is then in the past, and a bucket that expired while
    this transaction waited for it counts as expired."""
    if any(end is not None and end > now for end in expiries):
        return max(now, ledger_time(db_wall_clock()))
    return now
