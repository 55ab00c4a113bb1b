"""DRF, OpenAPI, idempotency and rate-limit settings."""

from config.env import env

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_THROTTLE_CLASSES": ["config.api.ratelimit.ApiKeyRateThrottle"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "config.api.pagination.ApiPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_RENDERER_CLASSES": ["config.api.fastjson.FastJSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["config.api.parsers.BoundedJSONParser"],
    "EXCEPTION_HANDLER": "config.api.exceptions.problem_exception_handler",
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "config.api.negotiation.FormatIsAParameter",
    # No OPTIONS metadata (it would describe objects outside the caller's tenancy).
    "DEFAULT_METADATA_CLASS": None,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU Bank API",
    "DESCRIPTION": "Credits, holds, jobs and metering for GPU time. Errors are RFC 9457 problem "
    "details; every mutating route needs an Idempotency-Key header (see docs/api.md).",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/docs/ loads Swagger UI from drf-spectacular-sidecar's static files (pinned in
    # requirements.txt), never from a CDN: it works offline and runs no unpinned third-party script.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "config.api.schema.add_problem_responses",
        "config.api.schema.add_fleet_enums",
    ],
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "scheduling.models.JobState",
        "AttemptStateEnum": "scheduling.models.AttemptState",
        "HoldStateEnum": "ledger.models.HoldState",
        "TransactionKindEnum": "ledger.models.TransactionKind",
        "BucketKindEnum": "ledger.models.BucketKind",
        "BucketSourceEnum": "ledger.models.BucketSource",  # a bucket's source (refund included)
        "IssuableSourceEnum": "ledger.api.serializers.ISSUABLE_SOURCES",  # what finance may issue
        "ApiKeyStateEnum": "accounts.models.API_KEY_STATES",
    },
}

# Idempotency keys are kept at least this long (DESIGN.md §7), then reaped by a beat task.
IDEMPOTENCY_KEY_TTL_SECONDS = env.int("IDEMPOTENCY_KEY_TTL_SECONDS", default=24 * 3600)
# The idempotency record's completion carries the COMMIT in the same round trip (PostgreSQL,
# outermost transaction only): see config/api/idempotency.py. Off: Django commits separately.
IDEMPOTENCY_COMMIT_INLINE = env.bool("IDEMPOTENCY_COMMIT_INLINE", default=True)
# How long a duplicate request waits for the in-flight original before answering 409.
IDEMPOTENCY_LOCK_WAIT_MS = env.int("IDEMPOTENCY_LOCK_WAIT_MS", default=5000)

# PostgreSQL: a job submission that will be accepted runs as one statement, `jobs_submit`
# (docs/decisions/0006-job-submission-in-one-statement.md); anything else takes the Python path.
# Off: every submission takes the Python path (A/B benchmarks, equivalence tests).
JOBS_SUBMIT_IN_SQL = env.bool("JOBS_SUBMIT_IN_SQL", default=True)

# Requests with a larger body are rejected (400) before they are parsed.
API_MAX_BODY_BYTES = env.int("API_MAX_BODY_BYTES", default=64 * 1024)

# Rate limits per route scope: per API key (or session user) and per organization.
# "N/second|minute|hour"; a scope without an entry falls back to "default".
API_RATE_LIMITS: dict[str, dict[str, str]] = env.json(
    "API_RATE_LIMITS",
    default={
        "default": {"key": "1200/minute", "org": "6000/minute"},
        "jobs-submit": {"key": "600/minute", "org": "3000/minute"},
        "jobs-read": {"key": "1200/minute", "org": "6000/minute"},
        "finance": {"key": "300/minute", "org": "600/minute"},
    },
)
# An in-flight submission slot expires on its own after this long (a crashed worker's slot).
API_INFLIGHT_TTL_SECONDS = env.int("API_INFLIGHT_TTL_SECONDS", default=60)
# Connect and read timeout of the rate limiter's Redis calls: a Redis that stops answering costs a
# request about this long (then 503 `rate-limiter-unavailable`) instead of the client default.
API_REDIS_TIMEOUT_SECONDS = env.float("API_REDIS_TIMEOUT_SECONDS", default=1.0)

# API keys are cached per process this long: a revocation elsewhere, a deactivated user or a
# changed finance group takes effect within this window (expiry is exact). 0 disables the cache.
API_KEY_CACHE_SECONDS = env.float("API_KEY_CACHE_SECONDS", default=5.0)
# `ApiKey.last_used_at` is written at most once per this many seconds per key.
API_KEY_TOUCH_SECONDS = env.float("API_KEY_TOUCH_SECONDS", default=60.0)
# Usable (unrevoked, unexpired) keys a user may make for themselves in the portal or the API;
# an admin's keys for a user (admin, `manage.py create_api_key`) are not limited.
API_KEYS_MAX_ACTIVE_PER_USER = env.int("API_KEYS_MAX_ACTIVE_PER_USER", default=20)
# ... and at most this many new ones they made themselves in any 24 h (revoked ones too: no unlimited
# churn; `ApiKey.created_by` tells theirs from an admin's).
API_KEYS_MAX_CREATED_PER_DAY = env.int("API_KEYS_MAX_CREATED_PER_DAY", default=50)
