"""Unhandled errors on API routes are problem details too: 500 internal-error, 503 when the
database is unreachable; pages keep Django's own 500."""

from typing import Any

import pytest
from django.db import OperationalError
from rest_framework.test import APIClient

from tests.api.factories import Tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def failing_jobs_list(monkeypatch: pytest.MonkeyPatch) -> Any:
    import scheduling.api.views as views

    def fail_with(error: Exception) -> None:
        def visible_jobs(user: Any) -> Any:
            raise error

        monkeypatch.setattr(views, "visible_jobs", visible_jobs)

    return fail_with


def _client(tenant: Tenant, api: APIClient) -> APIClient:
    api.raise_request_exception = False  # answer as in production instead of re-raising
    return api


def test_unexpected_error_is_500_problem_with_request_id(
    tenant: Tenant, api: APIClient, failing_jobs_list: Any, caplog: pytest.LogCaptureFixture
) -> None:
    failing_jobs_list(RuntimeError("boom"))
    response = _client(tenant, api).get("/api/v1/jobs", HTTP_X_REQUEST_ID="req-123")
    assert response.status_code == 500
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert body["type"] == "internal-error" and body["request_id"] == "req-123"
    assert "boom" not in response.content.decode()  # no internals leak to the client
    assert any(r.name == "django.request" and r.exc_info for r in caplog.records)  # still logged


def test_database_unavailable_is_503_with_retry_after(
    tenant: Tenant, api: APIClient, failing_jobs_list: Any
) -> None:
    failing_jobs_list(OperationalError("could not connect to server"))
    response = _client(tenant, api).get("/api/v1/jobs")
    assert response.status_code == 503
    assert response.json()["type"] == "database-unavailable"
    assert response["Retry-After"] == "1"


def test_pages_keep_djangos_500(monkeypatch: pytest.MonkeyPatch, tenant: Tenant) -> None:
    from config.api import views

    request = type("R", (), {"path": "/portal/"})()
    monkeypatch.setattr(views.defaults, "server_error", lambda request: "django page")
    assert views.server_error(request) == "django page"
