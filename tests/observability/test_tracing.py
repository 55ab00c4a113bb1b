"""OpenTelemetry: a request's server span carries the request id (and the org id once known).

Uses a private TracerProvider with the SDK's InMemorySpanExporter — never the global provider —
and undoes the instrumentation afterwards, so no other test sees tracing state.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rest_framework.test import APIClient

from audit.models import AuditEvent
from config import telemetry
from tests.api.conftest import client_for
from tests.api.factories import Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.instrument(tracer_provider=provider, psycopg=False, celery=False)
    try:
        yield exporter
    finally:
        telemetry.uninstrument()
        provider.shutdown()


def server_spans(exporter: InMemorySpanExporter) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.kind == trace.SpanKind.SERVER]


def test_request_span_carries_the_request_id(spans: InMemorySpanExporter, api: APIClient) -> None:
    response = api.get("/api/v1/jobs", HTTP_X_REQUEST_ID="req-trace-1")
    assert response.status_code == 200 and response["X-Request-Id"] == "req-trace-1"
    [span] = server_spans(spans)
    assert span.attributes[telemetry.REQUEST_ID_ATTRIBUTE] == "req-trace-1"
    assert span.attributes["http.route"].endswith("jobs")


def test_generated_request_id_and_org_id_link_span_to_audit(
    spans: InMemorySpanExporter, tenant: Tenant, job_body: Callable[..., dict[str, Any]]
) -> None:
    api = client_for(tenant.user)
    response = api.post("/api/v1/jobs", job_body(gpu_count=1), format="json",
                        HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
    assert response.status_code == 201
    rid = response["X-Request-Id"]
    [span] = server_spans(spans)
    assert span.attributes[telemetry.REQUEST_ID_ATTRIBUTE] == rid
    assert span.attributes[telemetry.ORG_ID_ATTRIBUTE] == str(tenant.org.pk)
    # The audit trail's request id is the span's: the way from an audit row to its trace.
    event = AuditEvent.objects.get(action="sched.job.submit", subject_id=str(response.json()["id"]))
    assert event.request_id == rid
    # Redis (rate limits) is instrumented too: its spans are children of the request's trace.
    children = [s for s in spans.get_finished_spans() if s.context.trace_id == span.context.trace_id]
    assert len(children) > 1


def test_tracing_is_off_without_otel_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                 "OTEL_TRACES_CONSOLE"):
        monkeypatch.delenv(name, raising=False)
    assert telemetry.tracing_requested() is False
    assert telemetry.setup_telemetry(role="test") is False
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert telemetry.tracing_requested() is True
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert telemetry.tracing_requested() is False
