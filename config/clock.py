"""The database clock: the only clock for money and scheduling (DESIGN.md §8)."""

from datetime import datetime

from django.db import connection
from django.utils import timezone


def db_now() -> datetime:
    """`now()` of the current PostgreSQL transaction (stable within it); wall clock on SQLite."""
    if connection.vendor != "postgresql":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (value,) = cursor.fetchone()
    return value
