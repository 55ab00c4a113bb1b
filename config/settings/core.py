"""Django core settings: apps, middleware, templates, static files, logging."""

from config.env import BASE_DIR, env

DEBUG = env.bool("DEBUG", default=False)
# Embedded mode = no DATABASE_URL: the one-command demo on SQLite with in-process services.
EMBEDDED = not env.str("DATABASE_URL", default="")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI served from our static files, not a CDN
    "simple_history",
    "channels",
    "accounts",
    "audit",
    "ledger",
    "budgets",
    "scheduling",
    "metering",
    "portal",
]

MIDDLEWARE = [
    "config.request_context.RequestIdMiddleware",
    "config.telemetry.ObservabilityMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "config.api.middleware.ApiSessionMiddleware",  # these three: skipped by Bearer API calls
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "config.api.middleware.ApiAuthenticationMiddleware",
    "config.api.middleware.ApiMessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",  # kept: check --deploy wants it
    "simple_history.middleware.HistoryRequestMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.portal_nav",
            ],
        },
    },
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
# LOGGING (plain or JSON lines): config/settings/observability.py
