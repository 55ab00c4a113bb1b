"""Django's PostgreSQL backend with a health check that costs no round trip on a quiet socket.

With `CONN_HEALTH_CHECKS`, Django checks a persistent connection before its first use in every
request by sending `SELECT 1` (`is_usable`): one round trip per request, for PostgreSQL and for
the web worker. A connection that PostgreSQL has ended (restart, `pg_terminate_backend`, idle
timeout) has a readable socket here — the server's FATAL message, then EOF — since an idle
connection between requests receives nothing else (we never LISTEN). So: an idle connection in
a good state with nothing to read is usable as it is; anything else (errors since the last
check, a transaction left open, pending input) gets Django's `SELECT 1` as before.
"""

import select
from typing import Any

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        if self.connection is not None and not self.errors_occurred and _quiet(self.connection):
            return True
        return bool(super().is_usable())


def _quiet(conn: Any) -> bool:
    """An open, idle connection whose socket has nothing to read right now."""
    if conn.closed or conn.broken:
        return False
    pgconn = conn.pgconn
    if pgconn.status != pq.ConnStatus.OK:
        return False
    if pgconn.transaction_status != pq.TransactionStatus.IDLE:
        return False
    poller = select.poll()
    poller.register(pgconn.socket, select.POLLIN | select.POLLPRI)
    return not poller.poll(0)
