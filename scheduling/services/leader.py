"""The scheduler's single-leader lock: one pass at a time across every process and host.

PostgreSQL: a transaction-scoped advisory lock, taken without waiting — a second pass gives up at
once and is released automatically when the leader's transaction ends (commit, rollback or a dead
connection), so there is no lease to expire or clean up. SQLite (embedded mode) runs every write
transaction IMMEDIATE, which already serializes passes, so there the lock is always granted.
"""

from __future__ import annotations

from django.db import connection

# An arbitrary, fixed 64-bit key for the scheduler pass (ASCII "GPUSCHED").
SCHEDULER_LOCK_KEY = 0x4750_5553_4348_4544


def try_lead() -> bool:
    """Try to become the pass leader for the current transaction (call inside `atomic()`)."""
    if not connection.in_atomic_block:
        raise RuntimeError("try_lead() must run inside a transaction; the lock ends with it")
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [SCHEDULER_LOCK_KEY])
        (granted,) = cursor.fetchone()
    return bool(granted)
