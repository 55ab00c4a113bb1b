"""Shared fixtures: every test that touches the database runs on PostgreSQL."""

from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client


@pytest.fixture(autouse=True)
def _clean_redis_cache() -> None:
    # Rate-limit counters and cached values must not leak between tests. Only this run's keys
    # (settings.test gives each run its own prefix): concurrent runs share the Redis database.
    cache.delete_pattern("*")
    # The rate limiter's own counters (`limits`, keyed by this run's prefix and the caller's user
    # id): a second run of the same TEST_DB_NAME within a minute starts the same ids again.
    from django.conf import settings
    from django_redis import get_redis_connection

    connection = get_redis_connection("default")
    prefix = settings.CACHES["default"].get("KEY_PREFIX", "")
    stale = list(connection.scan_iter(match=f"LIMITS:{{LIMITER/api{prefix}/*", count=1000))
    if stale:
        connection.delete(*stale)


@pytest.fixture
def operator(db: Any) -> Any:
    """A superuser: the operator or finance person at the admin."""
    from tests.factories import UserFactory

    return UserFactory(is_staff=True, is_superuser=True)


@pytest.fixture
def staff(client: Client, operator: Any) -> Client:
    """The test client signed in as `operator`."""
    client.force_login(operator)
    return client
