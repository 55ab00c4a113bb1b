"""A scratch PostgreSQL database for a benchmark run: created, migrated, used, dropped.

The benchmarks that measure the project's own services against a raw-SQL baseline run on a
database of their own (gpubank_bench_<pid>) on the configured server, so they never touch the
development or test databases and leave nothing behind.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")

BASE_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpubank")
SCRATCH = f"gpubank_bench_{os.getpid()}"


def _url_for(dbname: str) -> str:
    return urlunsplit(urlsplit(BASE_URL)._replace(path=f"/{dbname}"))


def _admin(sql: str) -> None:
    with psycopg.connect(_url_for("postgres"), autocommit=True) as conn:
        conn.execute(sql)


@contextmanager
def scratch_database() -> Iterator[None]:
    """Create the scratch database, point Django at it, set Django up and migrate; drop it after."""
    _admin(f'CREATE DATABASE "{SCRATCH}"')
    os.environ["TEST_DATABASE_URL"] = _url_for(SCRATCH)
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield
    finally:
        from django.db import connections

        connections.close_all()
        _admin(f'DROP DATABASE IF EXISTS "{SCRATCH}" WITH (FORCE)')
