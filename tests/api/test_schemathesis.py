"""Schemathesis (stateless) against our OpenAPI schema, through the WSGI app: zero failures."""

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import schemathesis
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core import signals
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from accounts.models import Project, Region
from accounts.selectors import org_people
from accounts.services import create_api_key
from config.api.schema import apply_fleet_enums
from config.wsgi import application
from tests.api.conftest import PRIORITY_CLASSES
from tests.api.factories import make_tenant


def _schema() -> dict[str, Any]:
    # Generated in-process at collection time (no database yet), then given the names that the
    # fixtures below create — what /api/schema/ enumerates from the database in production.
    raw = SchemaGenerator().get_schema(request=None, public=True)
    enums = {"gpu_types": ["A100", "H100", "L4"], "max_memory": 80,
             "priority_classes": sorted(name for name, *_ in PRIORITY_CLASSES), "regions": ["eu", "us"]}
    return apply_fleet_enums(raw, enums)


# The node-agent protocol (/api/v1/agent/) authenticates nodes, not API keys; metering tests it.
_loaded = schemathesis.openapi.from_dict(_schema())
_loaded.app = application  # call the WSGI app in-process (what from_wsgi does)
schema = _loaded.exclude(path_regex="^/api/v1/agent/")


@pytest.fixture
def _keep_test_connection() -> Iterator[None]:
    # The raw WSGI handler closes the DB connection after each request (request_finished);
    # Django's test client disconnects that handler too, so the test transaction survives.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def auth_header(_keep_test_connection: None, fleet: dict) -> dict[str, str]:
    for code in ("eu", "us"):
        Region.objects.get_or_create(code=code, defaults={"name": code})
    tenant = make_tenant(funds=10**14)
    # Finance sees every org, so generated ids reach real objects as well as 404s.
    tenant.admin.groups.add(Group.objects.get_or_create(name="finance")[0])
    _key, raw = create_api_key(user=tenant.admin, name="schemathesis")
    return {"Authorization": f"Bearer {raw}"}


@pytest.mark.django_db
@schema.parametrize()
@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.filter_too_much])
def test_api_conforms_to_its_schema(case: Any, auth_header: dict[str, str]) -> None:
    headers = dict(auth_header)
    if case.method.upper() in ("POST", "PUT", "PATCH", "DELETE"):
        # Like a real client: a fresh key per intended effect. (Hypothesis would otherwise reuse
        # minimal keys such as "0" across different bodies, which is a correct 422.)
        headers["Idempotency-Key"] = uuid.uuid4().hex
    cross_field = _violates_budget_window_rule(case) or _violates_dependency_rule(case)
    cross_field = cross_field or _reversed_window(case) or _names_a_missing_object(case)
    in_time = _asks_for_a_future_balance(case) or _asks_for_a_past_expiry(case)
    excluded = [positive_data_acceptance] if cross_field or in_time else []
    if _negative_only_in_headers(case):
        # Its broken Authorization/Idempotency-Key headers are replaced by valid ones above, so
        # the request it sends is valid: acceptance is right, not a failure to reject.
        excluded.append(negative_data_rejection)
    case.call_and_validate(headers=headers, excluded_checks=excluded)


def _negative_only_in_headers(case: Any) -> bool:
    meta = case.meta
    if meta is None:
        return False
    negative = {loc for loc, info in meta.components.items() if info.mode.is_negative}
    return negative == {ParameterLocation.HEADER}


def _has_negative_parts(case: Any) -> bool:
    meta = case.meta
    return meta is not None and any(info.mode.is_negative for info in meta.components.values())


def _violates_budget_window_rule(case: Any) -> bool:
    """A budget body that is schema-valid but breaks the cross-field rule OpenAPI 3.0 cannot state
    (window budgets need window_start < window_end; month budgets take no window): a 400 is the
    right answer there (tests/api/test_finance_routes.py checks it), not a schema violation."""
    body = case.body if isinstance(case.body, dict) else None
    if case.method.upper() != "PUT" or not case.path.endswith("/budget") or body is None:
        return False
    start, end = body.get("window_start"), body.get("window_end")
    if body.get("period") != "window":
        return start is not None or end is not None
    if start is None or end is None:
        return True
    try:
        return datetime.fromisoformat(end) <= datetime.fromisoformat(start)
    except (TypeError, ValueError):
        return False  # unparseable times must still be judged by every check


def _asks_for_a_future_balance(case: Any) -> bool:
    """A balance `as_of` after now: a valid date-time, but the journal cannot answer for the future
    and OpenAPI cannot say "not after now"; the 400 is right (tests/api/test_balances.py)."""
    value = (case.query or {}).get("as_of")
    if not case.path.endswith("/balance") or not isinstance(value, str):
        return False
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return False  # unparseable times must still be judged by every check
    return when.tzinfo is not None and when > datetime.now(UTC)


def _asks_for_a_past_expiry(case: Any) -> bool:
    """A new API key's `expires_at` not after now: a valid date-time, but OpenAPI cannot say "in
    the future"; the 400 naming it is right (tests/api/test_own_api_keys.py)."""
    body = case.body if isinstance(case.body, dict) else None
    if case.method.upper() != "POST" or case.path != "/api/v1/api-keys" or body is None:
        return False
    try:
        when = datetime.fromisoformat(body.get("expires_at"))
    except (TypeError, ValueError):
        return False  # absent or unparseable times must still be judged by every check
    return when.tzinfo is not None and when <= datetime.now(UTC)


# (start, end) query parameters of the list routes: an end before the start is a 400.
WINDOWS = {"/api/v1/jobs": ("submitted_since", "submitted_until"), "/transactions": ("since", "until")}


def _reversed_window(case: Any) -> bool:
    """A list window whose end is before its start: both valid date-times, but the order is a
    cross-field rule OpenAPI cannot state; the 400 is right (test_job_list_filters.py,
    test_finance_routes.py)."""
    names = next((pair for path, pair in WINDOWS.items() if case.path.endswith(path)), None)
    query = case.query or {}
    if case.method.upper() != "GET" or names is None:
        return False
    start, end = query.get(names[0]), query.get(names[1])
    try:
        return datetime.fromisoformat(end) < datetime.fromisoformat(start)
    except (TypeError, ValueError):
        return False  # absent or unparseable times must still be judged by every check


def _violates_dependency_rule(case: Any) -> bool:
    """A job body naming a `dependency` without `depends_on`: schema-valid, but the rule ("only with
    depends_on") is cross-field too; the 400 is right (tests/api/test_job_dependencies.py)."""
    body = case.body if isinstance(case.body, dict) else None
    if case.method.upper() != "POST" or case.path != "/api/v1/jobs" or body is None:
        return False
    return body.get("dependency") is not None and not body.get("depends_on")


def _names_a_missing_object(case: Any) -> bool:
    """A body naming a user or project that does not exist (or is not the org's): schema-valid,
    since the schema cannot know the database, and a 400 naming the field is right
    (test_finance_routes.py, test_project_members.py; it was a 404 before QA's finding)."""
    body = case.body if isinstance(case.body, dict) else None
    if case.method.upper() != "POST" or body is None or _has_negative_parts(case):
        return False  # only schema-valid requests are judged for acceptance (and safe to look up)
    if case.path == "/api/v1/orgs" and isinstance(body.get("owner"), str):
        return not get_user_model().objects.filter(username=body["owner"], is_active=True).exists()
    if case.path.endswith("/credits") and isinstance(body.get("project"), int):
        return not Project.objects.filter(pk=body["project"]).exists()
    if case.path.endswith("/members"):
        project = Project.objects.filter(pk=(case.path_parameters or {}).get("project_id")).first()
        people = org_people(project.org_id) if project is not None else get_user_model().objects.none()
        if isinstance(body.get("user"), int):
            return not people.filter(pk=body["user"]).exists()
        if isinstance(body.get("username"), str):
            return not people.filter(username=body["username"]).exists()
    return False
