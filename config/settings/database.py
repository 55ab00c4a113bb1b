"""Database, cache and channel layer: PostgreSQL + Redis in production, SQLite + memory embedded."""

from config.env import BASE_DIR, env

from .core import EMBEDDED

if EMBEDDED:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env.str("SQLITE_PATH", default=str(BASE_DIR / "var" / "db.sqlite3")),
            # IMMEDIATE: every transaction takes the write lock up front, so SQLite
            # serializes writers instead of failing upgrades with "database is locked".
            "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
        }
    }
else:
    DATABASES = {"default": env.db("DATABASE_URL")}
    DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        # Same backend; its health check skips the `SELECT 1` round trip on a quiet socket.
        DATABASES["default"]["ENGINE"] = "config.pgbackend"

REDIS_URL = env.str("REDIS_URL", default="")

if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
        }
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
