"""Test settings: PostgreSQL and Redis on localhost, always (no SQLite, no mocks)."""

from config.env import env
from config.settings import *  # noqa: F403

DATABASES = {
    "default": env.db(
        "TEST_DATABASE_URL", default="postgres://postgres@127.0.0.1:5432/gpubank"
    )
}
DATABASES["default"]["CONN_MAX_AGE"] = 0
DATABASES["default"]["TEST"] = {"NAME": env.str("TEST_DB_NAME", default="test_gpubank")}
REDIS_URL = env.str("TEST_REDIS_URL", default="redis://127.0.0.1:6379/15")
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}
CHANNEL_LAYERS = {
    "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
}
CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
SECRET_KEY = "test-only-secret"  # noqa: S105
SECURE_SSL_REDIRECT = False
SESSION_COOKIE_SECURE = False
CSRF_COOKIE_SECURE = False
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
