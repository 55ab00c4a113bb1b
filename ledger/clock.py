"""The ledger's clock: the database's `now()` (DESIGN.md §8), with a test-only offset.

Production never sets the offset. Tests use `shifted(delta)` to run expiry, holds and releases
"as of" a later instant without sleeping; every ledger decision reads the time from here.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from config.clock import db_now

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
