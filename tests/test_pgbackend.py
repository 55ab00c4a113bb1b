"""config.pgbackend: the per-request health check costs no round trip on a quiet connection,
and still finds connections that PostgreSQL has ended."""

import time

import pytest
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper as DjangoWrapper

from config.pgbackend.base import DatabaseWrapper


@pytest.fixture
def wrapper(transactional_db):
    db = DatabaseWrapper(dict(connection.settings_dict), alias="pgbackend-test")
    db.connect()
    yield db
    db.close()


def test_quiet_connection_is_usable_without_a_query(wrapper, monkeypatch):
    pings = []
    monkeypatch.setattr(DjangoWrapper, "is_usable", lambda self: pings.append(1) or True)
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert wrapper.is_usable() is True
    assert pings == []


def test_errors_or_open_transaction_get_the_real_check(wrapper, monkeypatch):
    pings = []
    monkeypatch.setattr(DjangoWrapper, "is_usable", lambda self: pings.append(1) or True)
    wrapper.errors_occurred = True
    assert wrapper.is_usable() is True
    wrapper.errors_occurred = False
    wrapper.set_autocommit(False)
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT 1")  # the transaction is open now
    assert wrapper.is_usable() is True
    wrapper.rollback()
    wrapper.set_autocommit(True)
    assert len(pings) == 2


def test_connection_ended_by_the_server_is_not_usable(wrapper):
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
    deadline = time.monotonic() + 5
    while wrapper.is_usable() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert wrapper.is_usable() is False

