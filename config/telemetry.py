"""OpenTelemetry tracing (set up once per process) and the per-request observability middleware.

Tracing is off unless asked for, so the embedded demo and the benchmarks pay nothing:
- `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set: spans are batched
  to that collector over OTLP/HTTP (the exporter reads the standard `OTEL_*` variables itself);
- `OTEL_TRACES_CONSOLE=1`: spans are also printed to stdout (debugging);
- `OTEL_SDK_DISABLED=true` wins over both.
`setup_telemetry(role=...)` is called by manage.py, config/wsgi.py, config/asgi.py and the Celery
worker/beat start signals (config/celery.py); it instruments Django, psycopg, Redis and Celery.

Every request span carries `gpubank.request_id` (the `X-Request-Id` echoed to the client and stored
on every audit event and ledger transaction of the request) and, once a view knows the tenant,
`gpubank.org_id` — so an audit trail row leads to its trace by the request id.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from django.http import HttpRequest, HttpResponse
from opentelemetry import trace

from config import metrics
from config.request_context import current_request_id

log = logging.getLogger("gpubank.telemetry")
access_log = logging.getLogger("gpubank.access")

REQUEST_ID_ATTRIBUTE = "gpubank.request_id"
ORG_ID_ATTRIBUTE = "gpubank.org_id"
SUBMIT_ROUTE = "jobs"  # POST /api/v1/jobs (scheduling/api/urls.py)

org_id_var: ContextVar[str] = ContextVar("org_id", default="")
_configured = False
_instrumentors: list[Any] = []


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _otlp_endpoint() -> str:
    return (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip()


def tracing_requested() -> bool:
    if _flag("OTEL_SDK_DISABLED"):
        return False
    return bool(_otlp_endpoint()) or _flag("OTEL_TRACES_CONSOLE")


def setup_telemetry(*, role: str) -> bool:
    """Install the global tracer provider and instrument the libraries, once; False when off."""
    global _configured
    if _configured or not tracing_requested():
        return _configured
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SimpleSpanProcessor,
    )

    resource = Resource.create({
        "service.name": os.environ.get("OTEL_SERVICE_NAME", "gpubank"),
        "gpubank.role": role,
    })
    provider = TracerProvider(resource=resource)
    if _otlp_endpoint():
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    if _flag("OTEL_TRACES_CONSOLE"):
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    instrument(tracer_provider=provider)
    _configured = True
    log.info("tracing on (%s): otlp=%s console=%s", role, bool(_otlp_endpoint()),
             _flag("OTEL_TRACES_CONSOLE"))
    return True


def instrument(*, tracer_provider: Any, django: bool = True, psycopg: bool = True,
               redis: bool = True, celery: bool = True) -> None:
    """Instrument the libraries with `tracer_provider` (tests pass their own and undo it)."""
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    chosen = [(django, DjangoInstrumentor, {"response_hook": _response_hook}),
              (psycopg, PsycopgInstrumentor, {}),
              (redis, RedisInstrumentor, {}),
              (celery, CeleryInstrumentor, {})]
    for wanted, cls, options in chosen:
        if wanted:
            instrumentor = cls()
            instrumentor.instrument(tracer_provider=tracer_provider, **options)
            _instrumentors.append(instrumentor)


def uninstrument() -> None:
    """Undo `instrument` (tests)."""
    while _instrumentors:
        _instrumentors.pop().uninstrument()


def _response_hook(span: Any, request: HttpRequest, response: HttpResponse) -> None:
    # The request id is final only on the response (RequestIdMiddleware may have made it up).
    if span.is_recording() and (rid := response.get("X-Request-Id")):
        span.set_attribute(REQUEST_ID_ATTRIBUTE, rid)


def current_org_id() -> str:
    return org_id_var.get()


def annotate_org(org_id: int | str | None) -> None:
    """The request (or task) acts for this organization: tag the current span and later log lines."""
    if org_id is None:
        return
    org_id_var.set(str(org_id))
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attribute(ORG_ID_ATTRIBUTE, str(org_id))


def _route_of(request: HttpRequest) -> str:
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "<unmatched>"
    return match.view_name or match.route or "<unnamed>"


def _problem_type(response: HttpResponse) -> str:
    data = getattr(response, "data", None)
    return str(data.get("type", "")) if isinstance(data, dict) else ""


class ObservabilityMiddleware:
    """Per request: request id on the active span, HTTP metrics by route name and status, and one
    access log line (with request/org/trace ids). Placed right after RequestIdMiddleware."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        from django.conf import settings

        self.get_response = get_response
        self.access_log = settings.ACCESS_LOG

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute(REQUEST_ID_ATTRIBUTE, current_request_id())
        token = org_id_var.set("")
        try:
            response = self.get_response(request)
            elapsed = time.perf_counter() - started
            route = _route_of(request)
            status = response.status_code
            metrics.HTTP_REQUESTS.labels(route, request.method, str(status)).inc()
            metrics.HTTP_LATENCY.labels(route, request.method, str(status)).observe(elapsed)
            if route == SUBMIT_ROUTE and request.method == "POST":
                metrics.submission_result(status=status, problem_type=_problem_type(response))
            if self.access_log:
                access_log.info(
                    "%s %s %s %.1fms", request.method, request.path, status, elapsed * 1000,
                    extra={"route": route, "status": status, "duration_ms": round(elapsed * 1000, 2)},
                )
            return response
        finally:
            org_id_var.reset(token)
