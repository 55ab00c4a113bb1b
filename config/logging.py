"""Logging configuration: plain text (the embedded demo's default) or one JSON object per line.

Every record gets `request_id`, `org_id`, `trace_id` and `span_id` from the current context
(empty when unknown), so a log line links to its audit events (same request id) and its trace.
JSON lines come from python-json-logger; select them with `LOG_FORMAT=json`.
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace

from config.request_context import current_request_id

PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
JSON_FIELDS = (
    "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s %(org_id)s %(trace_id)s %(span_id)s"
)


class ContextFilter(logging.Filter):
    """Adds the request id, org id and OpenTelemetry trace/span ids to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        from config.telemetry import current_org_id

        if not getattr(record, "request_id", ""):
            record.request_id = current_request_id()
        if not getattr(record, "org_id", ""):
            record.org_id = current_org_id()
        ctx = trace.get_current_span().get_span_context()
        record.trace_id = format(ctx.trace_id, "032x") if ctx.is_valid else ""
        record.span_id = format(ctx.span_id, "016x") if ctx.is_valid else ""
        return True


class ClientErrorFilter(logging.Filter):
    """Drops the traceback Django attaches to a 4xx it logs (a refused admin page, an API 404): the
    refusal is the answer, not a fault, and a stack per 403 buries the real errors. The line stays;
    5xx keep their traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if record.name == "django.request" and isinstance(status, int) and 400 <= status < 500:
            record.exc_info, record.exc_text = None, None
        return True


def build_logging(*, fmt: str = "plain", level: str = "INFO") -> dict[str, Any]:
    """The LOGGING dict for `fmt` ("plain" or "json")."""
    if fmt not in ("plain", "json"):
        raise ValueError(f"LOG_FORMAT must be 'plain' or 'json', not {fmt!r}.")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "context": {"()": "config.logging.ContextFilter"},
            "client_errors": {"()": "config.logging.ClientErrorFilter"},
        },
        "formatters": {
            "plain": {"format": PLAIN_FORMAT},
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                "format": JSON_FIELDS,
                "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
            },
        },
        "handlers": {
            "console": {
                "class": "logging.StreamHandler", "formatter": fmt, "filters": ["context", "client_errors"],
            },
        },
        "root": {"handlers": ["console"], "level": level},
    }
