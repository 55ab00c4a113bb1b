"""Shared fixtures: every test that touches the database runs on PostgreSQL."""

import pytest
from django.core.cache import cache


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
