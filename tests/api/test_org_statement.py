"""GET /api/v1/orgs/{id}/statement: a month's opening and closing balance, what was issued, consumed
(per project and GPU type), expired and voided in between, as JSON or CSV; it adds up."""

import csv
import io
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from rest_framework.test import APIClient

from ledger.clock import ledger_now, shifted
from ledger.models import MICRO
from ledger.selectors import balance_breakdown
from ledger.services import capture, place_hold, void_credits
from tests.api.conftest import client_for
from tests.api.factories import Tenant, make_tenant
from tests.api.test_job_dependencies import run, submit
from tests.factories import UserFactory, fund

pytestmark = pytest.mark.django_db

LAST_MONTH = timedelta(days=40)  # always before the first instant of the month in progress


@pytest.fixture
def month_of_activity(fleet: dict, job_body: Callable, tenant: Tenant) -> dict[str, Any]:
    """Last month: 100 credits issued, 10 consumed without a job. This month: the tenant's 1,000
    and 50 more issued, a job runs two GPU-hours on its placed type, 5 credits are voided."""
    org = tenant.org
    with shifted(-LAST_MONTH):
        fund(org, 100 * MICRO, reference="october")
        old = place_hold(org=org, amount=10 * MICRO, key="old", project=tenant.project)
        capture(hold=old, amount=10 * MICRO, key="old-capture")
    topup = fund(org, 50 * MICRO, reference="november")
    job = submit(client_for(tenant.user), job_body, gpu_count=1, max_wall_seconds=3 * 3600)
    attempt = run(job["id"])
    cost = 2 * attempt.rate_per_gpu_hour  # two GPU-hours at the run's fixed rate
    capture(hold=attempt.hold, amount=cost, key="job-capture")
    void_credits(bucket=topup, reason="goodwill reversed", key="void", amount=5 * MICRO)
    return {"org": org, "cost": cost, "gpu_type": attempt.gpu_type.name, "attempt": attempt}


def test_a_month_adds_up_and_lists_what_was_consumed(
    month_of_activity: dict[str, Any], tenant: Tenant
) -> None:
    org, cost = month_of_activity["org"], month_of_activity["cost"]
    body = client_for(tenant.admin).get(f"/api/v1/orgs/{org.pk}/statement").json()
    assert body["month"] == ledger_now().strftime("%Y-%m")
    assert body["opening"]["total"] == 90 * MICRO  # last month: 100 issued, 10 consumed
    flows = (body["issued"], body["consumed"], body["expired"], body["voided"])
    assert flows == (1050 * MICRO, cost, 0, 5 * MICRO)
    issued, consumed, expired, voided = flows
    assert body["closing"]["total"] == body["opening"]["total"] + issued - consumed - expired - voided
    now = balance_breakdown(org=org)["totals"]
    assert (body["closing"]["available"], body["closing"]["held"]) == (now["available"], now["held"])
    assert sum(line["amount"] for line in body["consumption"]) == body["consumed"]
    (line,) = body["consumption"]
    assert (line["project"], line["gpu_type"], line["amount"], line["gpu_hours"]) == (
        tenant.project.pk, month_of_activity["gpu_type"], cost, 2.0,
    )
    assert [i["amount"] for i in body["issues"]] == [1000 * MICRO, 50 * MICRO]
    assert body["issues"][1]["reference"] == "november"
    assert body["final"] is False  # the month in progress

    last = (ledger_now() - LAST_MONTH).strftime("%Y-%m")
    before = client_for(tenant.admin).get(f"/api/v1/orgs/{org.pk}/statement?month={last}").json()
    assert (before["opening"]["total"], before["issued"], before["consumed"]) == (0, 100 * MICRO, 10 * MICRO)
    assert before["closing"]["total"] == body["opening"]["total"]  # one month closes what the next opens
    assert before["final"] is True  # ended, and no transaction begun in it is still open
    (old_line,) = before["consumption"]
    assert (old_line["gpu_type"], old_line["gpu_hours"]) == ("", 0.0)  # no job attempt behind it


def test_the_statement_as_csv(month_of_activity: dict[str, Any], tenant: Tenant) -> None:
    org, cost = month_of_activity["org"], month_of_activity["cost"]
    response = client_for(tenant.admin).get(f"/api/v1/orgs/{org.pk}/statement?format=csv")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    by_section = {row["section"]: row for row in rows}
    assert int(by_section["opening balance"]["amount_micro_credits"]) == 90 * MICRO
    assert int(by_section["consumed"]["amount_micro_credits"]) == cost
    assert by_section["consumed"]["gpu_type"] == month_of_activity["gpu_type"]
    assert int(by_section["total voided"]["amount_micro_credits"]) == 5 * MICRO
    closing = int(by_section["closing balance"]["amount_micro_credits"])
    assert closing == 90 * MICRO + 1050 * MICRO - cost - 5 * MICRO
    parts = [int(by_section[f"closing {p}"]["amount_micro_credits"]) for p in ("available", "held")]
    assert sum(parts) == closing and parts[1] == balance_breakdown(org=org)["totals"]["held"] > 0
    assert int(by_section["opening available"]["amount_micro_credits"]) == 90 * MICRO
    assert int(by_section["opening held"]["amount_micro_credits"]) == 0
    assert by_section["status"]["reference"] == "provisional"  # the month in progress
    accepted = client_for(tenant.admin).get(f"/api/v1/orgs/{org.pk}/statement", HTTP_ACCEPT="text/csv")
    assert accepted.content == response.content


@pytest.mark.parametrize("query, field", [
    ("month=2026-13", "month"), ("month=26-11", "month"), ("month=2999-01", "month"),
    ("month=9999-12", "month"), ("month=0000-01", "month"),
    ("month=%EF%BC%92%EF%BC%90%EF%BC%92%EF%BC%96-11", "month"),  # full-width digits
    ("monthh=2026-11", "monthh"), ("format=xml", "format"),
])
def test_bad_queries_are_400(query: str, field: str, api: APIClient, tenant: Tenant) -> None:
    """QA: `format=cvs` answered 404 (as if the org did not exist), odd months were echoed back or
    gave Python's own words ('year 10000 is out of range')."""
    response = client_for(tenant.admin).get(f"/api/v1/orgs/{tenant.org.pk}/statement?{query}")
    assert response.status_code == 400 and field in response.json()["errors"], response.content


def test_who_may_read_it(api: APIClient, tenant: Tenant) -> None:
    url = f"/api/v1/orgs/{tenant.org.pk}/statement"
    assert api.get(url).status_code == 403  # a project-only member: org-wide money is not theirs
    assert client_for(make_tenant().admin).get(url).status_code == 404  # another org's admin
    assert client_for(UserFactory()).get(url).status_code == 404
    assert client_for(tenant.admin).get(url).status_code == 200


def test_an_error_asked_as_csv_is_still_a_problem_document(tenant: Tenant) -> None:
    url = f"/api/v1/orgs/{tenant.org.pk}/statement?month=2026-13&format=csv"
    response = client_for(tenant.admin).get(url)
    assert response.status_code == 400 and response["Content-Type"].startswith("application/problem+json")
    assert "month" in response.json()["errors"]


def test_free_text_never_reaches_a_spreadsheet_as_a_formula(tenant: Tenant) -> None:
    """QA: a reference '=HYPERLINK(...)' went into the CSV as is, where a spreadsheet would run it."""
    fund(tenant.org, 5 * MICRO, reference='=HYPERLINK("http://x","a")')
    response = client_for(tenant.admin).get(f"/api/v1/orgs/{tenant.org.pk}/statement?format=csv")
    references = [row["reference"] for row in csv.DictReader(io.StringIO(response.content.decode()))]
    assert "'=HYPERLINK(\"http://x\",\"a\")" in references
    assert not any(ref.startswith(("=", "+", "-", "@")) for ref in references)
