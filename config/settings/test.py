"""Test settings: PostgreSQL and Redis on localhost, always (no SQLite, no mocks)."""

import os

from config.env import env
from config.settings import *  # noqa: F403

# One test database per test run (and its child processes, which inherit the variable), so
# concurrent runs on one machine never drop each other's database.
TEST_DB_NAME = os.environ.setdefault("TEST_DB_NAME", f"test_gpubank_{os.getpid()}")

DATABASES = {
    "default": env.db(
        "TEST_DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/gpubank"
    )
}
DATABASES["default"]["CONN_MAX_AGE"] = 0
DATABASES["default"]["TEST"] = {"NAME": TEST_DB_NAME}
REDIS_URL = env.str("TEST_REDIS_URL", default="redis://127.0.0.1:6379/15")
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        "KEY_PREFIX": TEST_DB_NAME,
    }
}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": TEST_DB_NAME},
    }
}
CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
SECRET_KEY = "test-only-secret"  # noqa: S105
SECURE_SSL_REDIRECT = False
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# The queue ordering behind GET /jobs/{id}/priority is ordered afresh on every call: a cached one
# would outlive the test that made it (the Redis cache is shared by the run). Its caching test
# turns it on.
SCHEDULER_QUEUE_VIEW_SECONDS = 0
