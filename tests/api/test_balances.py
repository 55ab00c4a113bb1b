"""GET balances over HTTP: `as_of` is the one query parameter (QA: unknown ones were ignored and
`?as_of=` answered today's figures), and a project's own holds apart from the buckets it shares."""

from datetime import timedelta
from typing import Any

import pytest

from accounts.models import Organization, Project
from ledger.clock import ledger_now, shifted
from ledger.models import MICRO
from ledger.services import capture, place_hold, release_hold
from tests.api.conftest import client_for
from tests.api.factories import Tenant
from tests.factories import ProjectFactory

pytestmark = pytest.mark.django_db


def _balance_urls(tenant: Tenant) -> list[str]:
    return [f"/api/v1/orgs/{tenant.org.pk}/balance", f"/api/v1/projects/{tenant.project.pk}/balance"]


def _hold(org: Organization, project: Project, amount: int, key: str) -> Any:
    return place_hold(org=org, amount=amount, key=key, project=project)


@pytest.mark.parametrize("query", ["as_off=2026-01-01T00:00:00Z", "fields=all", "project=1"])
def test_balance_routes_refuse_unknown_query_parameters(tenant: Tenant, query: str) -> None:
    admin = client_for(tenant.admin)
    for url in _balance_urls(tenant):
        response = admin.get(f"{url}?{query}")
        assert response.status_code == 400, url
        body = response.json()
        assert body["type"] == "validation-error"
        assert body["errors"] == {query.split("=")[0]: ["Unknown query parameter."]}


@pytest.mark.parametrize("path", ["/orgs/{org}", "/projects/{project}", "/orgs/{org}/budget",
                                  "/projects/{project}/budget"])
def test_routes_without_query_parameters_refuse_them(tenant: Tenant, path: str) -> None:
    url = "/api/v1" + path.format(org=tenant.org.pk, project=tenant.project.pk)
    response = client_for(tenant.admin).get(f"{url}?as_of=2026-11-22T03:40:00Z")
    assert response.status_code == 400, url
    assert response.json()["errors"] == {"as_of": ["Unknown query parameter."]}


@pytest.mark.parametrize(("value", "message"), [
    ("2026-11-22T03:40:00", "Give the time with its UTC offset"),  # naive: whose 03:40?
    ("2026-11-22", "Give the time with its UTC offset"),
    ("yesterday", "Datetime has wrong format"),
    ("2026-13-01T00:00:00Z", "Datetime has wrong format"),
])
def test_a_bad_as_of_is_a_400_that_says_why(tenant: Tenant, value: str, message: str) -> None:
    admin = client_for(tenant.admin)
    for url in _balance_urls(tenant):
        response = admin.get(url, {"as_of": value})
        assert response.status_code == 400, (url, response.json())
        [error] = response.json()["errors"]["as_of"]
        assert error.startswith(message), error


def test_an_as_of_in_the_future_is_a_400(tenant: Tenant) -> None:
    future = (ledger_now() + timedelta(minutes=1)).isoformat()
    for url in _balance_urls(tenant):
        response = client_for(tenant.admin).get(url, {"as_of": future})
        assert response.status_code == 400
        [error] = response.json()["errors"]["as_of"]
        assert error.startswith("Must not be in the future")


def test_as_of_answers_the_balance_as_it_stood(tenant: Tenant) -> None:
    """The tenant was funded 1,000 credits; a hold of 100 and a capture of 30 came after."""
    before = ledger_now()
    with shifted(timedelta(minutes=1)):
        hold = _hold(tenant.org, tenant.project, 100 * MICRO, "h1")
    with shifted(timedelta(minutes=2)):
        capture(hold=hold, amount=30 * MICRO, key="c1")
    admin = client_for(tenant.admin)
    with shifted(timedelta(minutes=3)):  # the ledger's clock, moved past the capture
        for url in _balance_urls(tenant):
            past = admin.get(url, {"as_of": before.isoformat()}).json()
            assert past["as_of"] == before.isoformat().replace("+00:00", "Z")
            totals = past["totals"]
            assert (totals["available"], totals["held"], totals["spent"]) == (1000 * MICRO, 0, 0)
            mid = admin.get(url, {"as_of": (before + timedelta(seconds=90)).isoformat()}).json()["totals"]
            assert (mid["available"], mid["held"], mid["spent"]) == (900 * MICRO, 100 * MICRO, 0)
            now = admin.get(url).json()
            assert now["totals"]["spent"] == 30 * MICRO
            assert admin.get(url, {"as_of": now["as_of"]}).json() == now  # journal = caches
    before_any = admin.get(_balance_urls(tenant)[0], {"as_of": "2000-01-01T00:00:00+02:00"}).json()
    assert before_any["buckets"] == [] and before_any["totals"]["granted"] == 0


def test_a_project_balance_tells_its_own_holds_from_the_shared_buckets(tenant: Tenant) -> None:
    """QA: the LLM project's balance showed a vision job's hold, drawn from the org-wide bucket
    both projects share, as if it were its own."""
    other = ProjectFactory(org=tenant.org)
    start = ledger_now()
    with shifted(timedelta(minutes=1)):
        mine = _hold(tenant.org, tenant.project, 40 * MICRO, "mine")
        theirs = _hold(tenant.org, other, 70 * MICRO, "theirs")
    with shifted(timedelta(minutes=2)):
        capture(hold=mine, amount=15 * MICRO, key="mine-c")
        capture(hold=theirs, amount=50 * MICRO, key="theirs-c")
        release_hold(hold=mine)
    admin = client_for(tenant.admin)
    with shifted(timedelta(minutes=3)):
        balance = admin.get(f"/api/v1/projects/{tenant.project.pk}/balance").json()
        at_one_and_a_half = (start + timedelta(seconds=90)).isoformat()
        earlier = admin.get(f"/api/v1/projects/{tenant.project.pk}/balance", {"as_of": at_one_and_a_half})
        org = admin.get(f"/api/v1/orgs/{tenant.org.pk}/balance").json()
    # The bucket totals stay what they are: both projects' holds on the shared org-wide bucket.
    assert (balance["totals"]["held"], balance["totals"]["spent"]) == (20 * MICRO, 65 * MICRO)
    assert balance["project_usage"] == {"held": 0, "spent": 15 * MICRO}
    assert earlier.json()["project_usage"] == {"held": 40 * MICRO, "spent": 0}
    assert earlier.json()["totals"]["held"] == 110 * MICRO
    assert org["project_usage"] is None


def test_project_usage_from_the_journal_equals_the_holds_columns(tenant: Tenant) -> None:
    """`project_usage` now reads the holds' columns, as of a time the journal: they must agree."""
    hold = _hold(tenant.org, tenant.project, 100 * MICRO, "h")
    capture(hold=hold, amount=1, key="c")
    url = f"/api/v1/projects/{tenant.project.pk}/balance"
    admin = client_for(tenant.admin)
    with shifted(timedelta(seconds=1)):
        now = admin.get(url).json()
        rebuilt = admin.get(url, {"as_of": now["as_of"]}).json()
    assert now["project_usage"] == rebuilt["project_usage"] == {"held": 100 * MICRO - 1, "spent": 1}


def test_a_past_balance_shows_a_closed_bucket_as_it_was_then(tenant: Tenant) -> None:
    """QA: closing moves the bucket's expiry to the close; a balance as of an earlier time showed
    that expiry already (and counted the bucket as expiring within 7 days)."""
    from ledger.services import void_credits
    from tests.factories import fund

    with shifted(-timedelta(hours=2)):
        bucket = fund(tenant.org, 5 * MICRO, reference="to-close")
    before = (ledger_now() - timedelta(hours=1)).isoformat()
    void_credits(bucket=bucket, reason="chargeback", key="close", close=True)
    admin = client_for(tenant.admin)
    then = admin.get(f"/api/v1/orgs/{tenant.org.pk}/balance", {"as_of": before}).json()
    row = next(b for b in then["buckets"] if b["id"] == bucket.pk)
    assert (row["expires_at"], row["closed_at"], row["status"]) == (None, None, "active")
    assert then["expiring"]["7d"] == 0
    now = admin.get(f"/api/v1/orgs/{tenant.org.pk}/balance").json()
    row = next(b for b in now["buckets"] if b["id"] == bucket.pk)
    assert row["closed_at"] is not None and row["expires_at"] == row["closed_at"]
    assert row["status"] == "expired"
