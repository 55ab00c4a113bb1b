"""Wait, from a test, until another database session is blocked on a lock."""

import threading
import time

from django.db import connection


def another_session_waits(
    done: threading.Event, *, wait_event: str = "", timeout: float = 10, sessions: int = 1
) -> bool:
    """True once another session of this database waits on a lock (of kind `wait_event` if given:
    `advisory`, `transactionid`, ...), or `sessions` others do; False if `done` was set first or on
    timeout. Works inside a transaction too: the activity snapshot, otherwise kept for the
    transaction, is cleared."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done.is_set():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND (%s = '' OR wait_event = %s) AND pid <> pg_backend_pid() "
                           "AND datname = current_database()", [wait_event, wait_event])
            if cursor.fetchone()[0] >= sessions:
                return True
        time.sleep(0.02)
    return False
