"""Shared fixtures: every test that touches the database runs on PostgreSQL."""

import pytest
from django.core.cache import cache


@pytest.fixture(autouse=True)
def _clean_redis_cache() -> None:
    # Rate-limit counters and cached values must not leak between tests. Only this run's keys
    # (settings.test gives each run its own prefix): concurrent runs share the Redis database.
    cache.delete_pattern("*")
