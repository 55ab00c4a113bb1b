"""The database clock: the only clock for money and scheduling (DESIGN.md §8)."""

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import connection
from django.utils import timezone


def _read(function: str) -> datetime:
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}()")
        (value,) = cursor.fetchone()
    return value


def db_now() -> datetime:
    """`now()` of the current PostgreSQL transaction (stable within it); wall clock on SQLite."""
    return _read("now")


def db_wall_clock() -> datetime:
    """`clock_timestamp()`: the database's wall clock now, which moves on within a transaction
    (`now()` is the transaction's start). For a decision made after a lock wait that must see
    as past whatever committed before the lock was granted; wall clock on SQLite."""
    return _read("clock_timestamp")


def aware_row(row: Sequence[Any]) -> tuple[Any, ...]:
    """A row read by plain SQL, its datetimes UTC-aware as the ORM gives them.

    SQLite (embedded mode) stores UTC and hands plain SQL naive datetimes; the ORM's converters
    are skipped on that path, so comparing one with `now()` raised TypeError (QA: an expiring API
    key answered 500, any maintenance window stopped every scheduler pass). PostgreSQL's are aware.
    """
    if connection.vendor == "postgresql":
        return tuple(row)
    return tuple(v.replace(tzinfo=UTC) if isinstance(v, datetime) and v.tzinfo is None else v for v in row)
