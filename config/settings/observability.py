"""Observability settings: log format, access log, Prometheus (docs/observability.md).

Tracing is configured from the standard `OTEL_*` environment variables by config/telemetry.py.
"""

from config.env import env
from config.logging import build_logging

# plain: the embedded demo's readable lines; json: one object per line for a log pipeline.
LOG_FORMAT = env.str("LOG_FORMAT", default="plain")
LOGGING = build_logging(fmt=LOG_FORMAT, level=env.str("LOG_LEVEL", default="INFO"))
# One line per request (method, path, status, duration, request/org/trace ids). The embedded
# servers (runserver, uvicorn) already print their own plain access lines.
ACCESS_LOG = env.bool("ACCESS_LOG", default=LOG_FORMAT == "json")
# `/metrics` answers only a scrape carrying `Authorization: Bearer <METRICS_TOKEN>` when it is set
# (Prometheus' `authorization` scrape option); unset, it is open, as in the embedded demo.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
