"""Structured logs: JSON lines carry the request id, org id and trace/span ids."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import logging.config
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from config.logging import build_logging
from tests.api.conftest import client_for
from tests.api.factories import Tenant

pytestmark = pytest.mark.django_db


@contextlib.contextmanager
def _handler_on(settings: Any, fmt: str, name: str, level: str) -> Iterator[io.StringIO]:
    """`build_logging(fmt)`'s console handler, writing to a buffer, on logger `name` alone."""
    config = build_logging(fmt=fmt)
    buffer = io.StringIO()
    config["handlers"]["console"] = {**config["handlers"]["console"], "stream": buffer}
    config["root"] = {"level": "WARNING"}  # leave the root logger's handlers alone
    config["loggers"] = {name: {"handlers": ["console"], "level": level, "propagate": False}}
    logging.config.dictConfig(config)
    try:
        yield buffer
    finally:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
        logging.config.dictConfig(settings.LOGGING)


@pytest.fixture
def json_lines(settings: Any) -> Iterator[io.StringIO]:
    """The JSON handler of `build_logging("json")`, writing to a buffer, on the access logger."""
    settings.ACCESS_LOG = True
    with _handler_on(settings, "json", "gpubank.access", "INFO") as buffer:
        yield buffer


def lines(buffer: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]


def test_access_line_is_json_with_request_and_org_id(
    json_lines: io.StringIO, tenant: Tenant, job_body: Callable[..., dict[str, Any]]
) -> None:
    response = client_for(tenant.user).post(
        "/api/v1/jobs", job_body(gpu_count=1), format="json",
        HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex, HTTP_X_REQUEST_ID="log-req-1",
    )
    assert response.status_code == 201
    [line] = [entry for entry in lines(json_lines) if entry["logger"] == "gpubank.access"]
    assert line["request_id"] == "log-req-1"
    assert line["org_id"] == str(tenant.org.pk)
    assert line["route"] == "jobs" and line["status"] == 201 and line["level"] == "INFO"
    assert line["message"].startswith("POST /api/v1/jobs 201")
    assert {"time", "trace_id", "span_id", "duration_ms"} <= set(line)


def test_log_lines_carry_the_current_trace(json_lines: io.StringIO) -> None:
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("work") as span:
        logging.getLogger("gpubank.access").info("inside a span")
    [line] = lines(json_lines)
    assert line["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert line["span_id"] == format(span.get_span_context().span_id, "016x")
    assert line["request_id"] == ""


def test_plain_stays_the_default_and_formats_are_checked() -> None:
    from django.conf import settings

    assert settings.LOG_FORMAT == "plain"
    assert settings.LOGGING["handlers"]["console"]["formatter"] == "plain"
    with pytest.raises(ValueError, match="LOG_FORMAT"):
        build_logging(fmt="xml")


@pytest.fixture
def request_log(settings: Any) -> Iterator[io.StringIO]:
    """The plain handler of `build_logging()`, writing to a buffer, on Django's request logger."""
    with _handler_on(settings, "plain", "django.request", "WARNING") as buffer:
        yield buffer


def test_a_refused_admin_page_logs_one_line_and_no_traceback(
    request_log: io.StringIO, tenant: Tenant
) -> None:
    """QA: every ordinary 403 in the admin logged a full Python traceback."""
    from django.test import Client

    tenant.admin.is_staff = True
    tenant.admin.save()
    client = Client()
    client.force_login(tenant.admin)
    assert client.get("/admin/ledger/bucket/add/").status_code == 403
    text = request_log.getvalue()
    assert "Forbidden" in text and "Traceback" not in text


def test_a_server_error_keeps_its_traceback() -> None:
    from config.logging import ClientErrorFilter

    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys

        info = sys.exc_info()
    record = logging.LogRecord("django.request", logging.ERROR, __file__, 1, "Server Error", (), info)
    record.status_code = 500
    assert ClientErrorFilter().filter(record) and record.exc_info is info
    record = logging.LogRecord("django.request", logging.WARNING, __file__, 1, "Forbidden", (), info)
    record.status_code = 403
    assert ClientErrorFilter().filter(record) and record.exc_info is None
