"""Hot-path reads and writes as PostgreSQL server-side prepared statements.

Django's psycopg cursors bind parameters client-side, so PostgreSQL parses and plans every
statement again; for the short statements of a job submission planning costs several times
the execution (e.g. the project + roles lookup: ~0.23 ms to plan, ~0.05 ms to run). A plain
psycopg cursor on Django's connection with `prepare=True` plans each statement once per
connection (the ledger's hot-path calls work the same way, ledger/services/_sql.py).

`execute` keeps what Django's cursor gives callers: it runs in Django's current transaction
(same connection), database errors are wrapped as Django's, `connection.execute_wrapper`
wrappers see the statement, and it is logged in `connection.queries` when queries are logged
(tests counting queries, DEBUG). Other databases (the embedded SQLite mode) use Django's cursor.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections

# Django opens psycopg connections with `prepare_threshold=None`, which makes psycopg ignore
# `prepare=True`; this threshold lets explicit `prepare=True` calls prepare and changes nothing
# else (Django's own cursors never prepare). The ledger's hot-path calls use it too.
_ONLY_EXPLICIT = 2**31 - 1


def _cursor(db: Any) -> psycopg.Cursor[Any]:
    """One server-binding cursor per (thread's) connection, made again if Django reconnects."""
    cursor = getattr(db, "_gpubank_prepared_cursor", None)
    if cursor is None or cursor.closed or cursor.connection is not db.connection:
        if db.connection.prepare_threshold is None:
            db.connection.prepare_threshold = _ONLY_EXPLICIT
        cursor = db._gpubank_prepared_cursor = psycopg.Cursor(db.connection)
    return cursor


def execute(sql: str, params: Sequence[Any], *, fetch: str = "one") -> Any:
    """Run `sql` (with `%s` placeholders) prepared; return `fetchone()` / `fetchall()` / None
    (`fetch` = "one" | "all" | "none")."""
    db = connections[DEFAULT_DB_ALIAS]  # once: each `connection.x` is a thread-local lookup
    if db.vendor != "postgresql":
        with db.cursor() as cursor:
            cursor.execute(sql, params)
            return _fetch(cursor, fetch)
    db.ensure_connection()
    db.validate_no_broken_transaction()
    cursor = _cursor(db)

    def run(sql: str, params: Sequence[Any], many: bool, context: dict[str, Any]) -> Any:
        with db.wrap_database_errors:
            cursor.execute(sql, params, prepare=True)

    executor = run
    for wrapper in reversed(db.execute_wrappers):
        executor = _wrap(wrapper, executor)
    logged = db.queries_logged
    start = time.monotonic() if logged else 0.0
    try:
        executor(sql, params, False, {"connection": db, "cursor": cursor})
        return _fetch(cursor, fetch)
    finally:
        if logged:
            db.queries_log.append(
                {"sql": f"{sql} -- {list(params)!r}", "time": f"{time.monotonic() - start:.3f}"}
            )


def _wrap(wrapper: Any, executor: Any) -> Any:
    def call(sql: str, params: Sequence[Any], many: bool, context: dict[str, Any]) -> Any:
        return wrapper(executor, sql, params, many, context)

    return call


def _fetch(cursor: Any, fetch: str) -> Any:
    if fetch == "one":
        return cursor.fetchone()
    if fetch == "all":
        return cursor.fetchall()
    return None
