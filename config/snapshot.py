"""Reads that must agree with each other: one snapshot of the database for all of them."""

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction


@contextmanager
def one_snapshot() -> Iterator[None]:
    """Run the enclosed reads in one snapshot: a REPEATABLE READ READ ONLY transaction on
    PostgreSQL, so a transaction committing meanwhile is in all of them or in none. Inside a
    caller's transaction it is that transaction (its snapshot and its order: tests, a bigger read);
    SQLite serializes writers, so a transaction there is already one snapshot."""
    if connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield
