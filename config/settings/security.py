"""Secrets and HTTP security. Production secrets have no default."""

from config.env import env

from .core import DEBUG, EMBEDDED

if DEBUG or EMBEDDED:
    SECRET_KEY = env.str("SECRET_KEY", default="insecure-embedded-demo-key-not-for-production")
    ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
else:
    SECRET_KEY = env.str("SECRET_KEY")
    ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])

SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=not (DEBUG or EMBEDDED))
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=not (DEBUG or EMBEDDED))
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=not (DEBUG or EMBEDDED))
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0 if (DEBUG or EMBEDDED) else 31536000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not (DEBUG or EMBEDDED)
SECURE_HSTS_PRELOAD = not (DEBUG or EMBEDDED)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
X_FRAME_OPTIONS = "DENY"
