"""Orgs, projects, members, credits, budgets, balances and the journal over HTTP."""

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import Membership, Organization, OrgMembership
from budgets.models import Budget
from ledger.models import MICRO, Bucket
from tests.api.conftest import H100_PRICE, client_for
from tests.api.factories import Tenant, make_tenant
from tests.factories import OrgMembershipFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def finance() -> APIClient:
    user = UserFactory()
    user.groups.add(Group.objects.get_or_create(name="finance")[0])
    return client_for(user)


def send(client: APIClient, method: str, url: str, body: Any = None, key: str | None = None) -> Any:
    return getattr(client, method)(url, body, format="json", HTTP_IDEMPOTENCY_KEY=key or uuid.uuid4().hex)


def test_finance_creates_org_with_owner_then_owner_builds_it(finance: APIClient, fleet: dict) -> None:
    owner = UserFactory()
    response = send(finance, "post", "/api/v1/orgs", {"name": "Acme", "slug": "acme", "owner": owner.username,
                                                      "hold_window_seconds": 3600})
    assert response.status_code == 201, response.json()
    org_id = response.json()["id"]
    assert OrgMembership.objects.get(org_id=org_id).role == "owner"
    assert send(finance, "post", "/api/v1/orgs", {"name": "Acme", "slug": "acme"}).status_code == 409
    owner_api = client_for(owner)
    project = send(owner_api, "post", f"/api/v1/orgs/{org_id}/projects", {"name": "LLM", "slug": "llm"})
    assert project.status_code == 201
    member = UserFactory()
    # Joining the org is the admin's (an org membership); the API adds the org's people to projects.
    OrgMembershipFactory(org=Organization.objects.get(pk=org_id), user=member, role="viewer")
    added = send(owner_api, "post", f"/api/v1/projects/{project.json()['id']}/members",
                 {"username": member.username, "role": "member"})
    assert added.status_code == 201 and added.json()["user"] == member.pk
    again = send(owner_api, "post", f"/api/v1/projects/{project.json()['id']}/members",
                 {"user": member.pk, "role": "viewer"})
    assert again.status_code == 200 and Membership.objects.get(user=member).role == "viewer"


def test_only_finance_creates_orgs_and_credits(tenant: Tenant) -> None:
    admin = client_for(tenant.admin)
    response = send(admin, "post", "/api/v1/orgs", {"name": "X", "slug": "x"})
    assert response.status_code == 403 and response.json()["type"] == "permission-denied"
    response = send(admin, "post", f"/api/v1/orgs/{tenant.org.pk}/credits",
                    {"amount": 1, "kind": "paid", "source": "purchase", "reference": "r", "reason": "r"})
    assert response.status_code == 403


def test_members_cannot_manage_projects(tenant: Tenant) -> None:
    member = client_for(tenant.user)
    response = send(member, "post", f"/api/v1/orgs/{tenant.org.pk}/projects", {"name": "x", "slug": "x"})
    # A project-only member can see the org exists (their project is in it) but not manage it.
    assert response.status_code == 403


def test_issue_credits_and_read_balance(finance: APIClient, tenant: Tenant) -> None:
    expires = (timezone.now() + timedelta(days=5)).isoformat()
    response = send(finance, "post", f"/api/v1/orgs/{tenant.org.pk}/credits", {
        "amount": 50 * MICRO, "kind": "promotional", "source": "promotion", "reference": "promo-1",
        "reason": "launch", "expires_at": expires, "gpu_types": ["H100"], "project": tenant.project.pk,
    })
    assert response.status_code == 201, response.json()
    assert Bucket.objects.get(pk=response.json()["id"]).project == tenant.project
    balance = client_for(tenant.admin).get(f"/api/v1/orgs/{tenant.org.pk}/balance").json()
    assert balance["totals"]["available"] == 1050 * MICRO
    assert balance["promotional"]["available"] == 50 * MICRO
    assert balance["paid"]["available"] == 1000 * MICRO
    assert balance["expiring"] == {"7d": 50 * MICRO, "30d": 50 * MICRO}
    assert len(balance["buckets"]) == 2
    project_balance = client_for(tenant.user).get(f"/api/v1/projects/{tenant.project.pk}/balance").json()
    assert project_balance["project"] == tenant.project.pk


@pytest.mark.parametrize("body", [
    {"amount": 0, "kind": "paid", "source": "purchase", "reference": "r", "reason": "r"},
    {"amount": 5, "kind": "gold", "source": "purchase", "reference": "r", "reason": "r"},
    {"amount": 5, "kind": "paid", "source": "purchase", "reference": "", "reason": "r"},
    {"amount": 5, "kind": "paid", "source": "purchase", "reference": "r", "reason": "r",
     "effective_at": "2030-01-02T00:00:00Z", "expires_at": "2030-01-01T00:00:00Z"},
    {"amount": 5, "kind": "paid", "source": "purchase", "reference": "r", "reason": "r",
     "gpu_types": ["TPU"]},
    {"amount": 5, "kind": "paid", "source": "purchase", "reference": "inv\n7", "reason": "r"},  # QA
    {"amount": 5, "kind": "paid", "source": "purchase", "reference": "inv\t7", "reason": "r"},
])
def test_invalid_credit_issuance_is_400(finance: APIClient, tenant: Tenant, body: dict) -> None:
    response = send(finance, "post", f"/api/v1/orgs/{tenant.org.pk}/credits", body)
    assert response.status_code == 400, response.json()
    assert Bucket.objects.filter(org=tenant.org).count() == 1


@pytest.mark.parametrize("effective_at", [None, "2025-01-01T00:00:00Z"])
def test_credits_expiring_in_the_past_are_refused(finance: APIClient, tenant: Tenant,
                                                  effective_at: str | None) -> None:
    """QA: finance issued a bucket already expired (it showed available until the expiry sweep)."""
    body = {"amount": 5, "kind": "paid", "source": "purchase", "reference": "late", "reason": "r",
            "expires_at": "2025-06-01T00:00:00Z"}
    if effective_at:
        body["effective_at"] = effective_at
    response = send(finance, "post", f"/api/v1/orgs/{tenant.org.pk}/credits", body)
    problem = response.json()
    assert response.status_code == 400, problem
    assert (problem["type"], problem["detail"]) == ("invalid-expiry", "The expiry is in the past.")
    assert Bucket.objects.filter(org=tenant.org).count() == 1


def test_transactions_are_paginated_and_filtered(api: APIClient, job_body: Any, tenant: Tenant) -> None:
    for _ in range(3):
        send(api, "post", "/api/v1/jobs", job_body())
    admin = client_for(tenant.admin)
    page = admin.get(f"/api/v1/orgs/{tenant.org.pk}/transactions?page_size=2").json()
    assert page["count"] == 4 and len(page["results"]) == 2 and page["next"]
    holds = admin.get(f"/api/v1/orgs/{tenant.org.pk}/transactions?kind=hold").json()
    assert holds["count"] == 3
    assert all(sum(p["amount"] for p in t["postings"]) == 0 for t in holds["results"])
    future = admin.get(f"/api/v1/orgs/{tenant.org.pk}/transactions?since=2100-01-01T00:00:00Z").json()
    assert future["count"] == 0
    assert admin.get(f"/api/v1/orgs/{tenant.org.pk}/transactions?kind=bogus").status_code == 400


def test_transactions_since_after_until_is_400_naming_until(api: APIClient, job_body: Any,
                                                            tenant: Tenant) -> None:
    """QA: a reversed range was an empty 200."""
    send(api, "post", "/api/v1/jobs", job_body())
    admin, url = client_for(tenant.admin), f"/api/v1/orgs/{tenant.org.pk}/transactions"
    response = admin.get(url, {"since": "2026-02-01T00:00:00Z", "until": "2026-01-31T00:00:00Z"})
    problem = response.json()
    assert response.status_code == 400, problem
    assert problem["type"] == "validation-error"
    assert problem["errors"] == {"until": ["Must not be before since."]}
    # The same instant written with two offsets is an empty range, not a reversed one.
    same = admin.get(url, {"since": "2026-02-01T00:00:00+01:00", "until": "2026-01-31T23:00:00Z"})
    assert same.status_code == 200 and same.json()["count"] == 0
    everything = admin.get(url, {"since": "2000-01-01T00:00:00Z", "until": "2100-01-01T00:00:00Z"})
    assert everything.json()["count"] == 2  # the issue and the job's hold


def test_budgets_put_get_and_member_level(api: APIClient, job_body: Any, tenant: Tenant) -> None:
    admin = client_for(tenant.admin)
    url = f"/api/v1/projects/{tenant.project.pk}/members/{tenant.user.pk}/budget"
    assert admin.get(url).status_code == 404
    created = send(admin, "put", url, {"period": "month", "limit": H100_PRICE, "enforcement": "hard"})
    assert created.status_code == 201 and created.json()["level"] == "member"
    updated = send(admin, "put", url, {"period": "month", "limit": 2 * H100_PRICE, "enforcement": "hard"})
    assert updated.status_code == 200 and Budget.objects.count() == 1
    assert send(api, "post", "/api/v1/jobs", job_body(gpu_count=3)).json()["level"] == "member"
    assert send(api, "post", "/api/v1/jobs", job_body(gpu_count=2)).status_code == 201
    current = admin.get(url).json()["current_period"]
    assert current["held"] == 2 * H100_PRICE and current["remaining"] == 0
    window = send(admin, "put", f"/api/v1/orgs/{tenant.org.pk}/budget", {
        "period": "window", "limit": 5, "enforcement": "soft",
        "window_start": "2020-01-01T00:00:00Z", "window_end": "2020-02-01T00:00:00Z"})
    assert window.status_code == 201 and window.json()["current_period"] is None
    bad = send(admin, "put", f"/api/v1/orgs/{tenant.org.pk}/budget",
               {"period": "window", "limit": 5, "enforcement": "soft"})
    assert bad.status_code == 400 and "window_end" in bad.json()["errors"]


def test_member_budget_needs_a_member(tenant: Tenant) -> None:
    stranger = UserFactory()
    url = f"/api/v1/projects/{tenant.project.pk}/members/{stranger.pk}/budget"
    body = {"period": "month", "limit": 1, "enforcement": "hard"}
    response = send(client_for(tenant.admin), "put", url, body)
    assert response.status_code == 404
    # QA: a bare "Not found." left the org owner guessing what was missing.
    assert response.json()["detail"].startswith(f"User {stranger.pk} is not a member of project")


def test_job_list_detail_filters_and_cancel(api: APIClient, job_body: Any, tenant: Tenant) -> None:
    first = send(api, "post", "/api/v1/jobs", job_body()).json()
    send(api, "post", "/api/v1/jobs", job_body())
    listing = api.get(f"/api/v1/jobs?project={tenant.project.pk}&state=queued").json()
    assert listing["count"] == 2 and "attempts" not in listing["results"][0]
    detail = api.get(f"/api/v1/jobs/{first['id']}").json()
    assert detail["wait_reason"] == "" and detail["attempts"] == [] and detail["hold"]["id"]
    cancel = send(api, "post", f"/api/v1/jobs/{first['id']}/cancel", key="c")
    replay = send(api, "post", f"/api/v1/jobs/{first['id']}/cancel", key="c")
    fresh_key = send(api, "post", f"/api/v1/jobs/{first['id']}/cancel")
    assert cancel.json()["state"] == replay.json()["state"] == fresh_key.json()["state"] == "cancelled"
    assert replay["Idempotent-Replayed"] == "true"
    assert cancel.json()["hold"]["state"] == "settled" and cancel.json()["hold"]["remaining"] == 0
    assert api.get("/api/v1/jobs?state=cancelled").json()["count"] == 1
    assert api.get("/api/v1/jobs?state=nope").status_code == 400
    assert api.get("/api/v1/jobs/999999").json()["type"] == "not-found"


_WINDOW = {"period": "window", "limit": 5, "enforcement": "soft"}


@pytest.mark.parametrize(("body", "field"), [
    ({**_WINDOW, "window_start": "2020-02-01T00:00:00Z", "window_end": "2020-01-01T00:00:00Z"},
     "window_end"),
    ({**_WINDOW, "window_start": "2020-01-01T00:00:00Z", "window_end": "2020-01-01T00:00:00Z"},
     "window_end"),
    # 2020-01-01 00:00 +14:00 is 2019-12-31 10:00Z, before 2020-01-01 00:00 -12:00 (12:00Z): valid
    ({**_WINDOW, "window_start": "2020-01-01T00:00:00-12:00", "window_end": "2020-01-01T00:00:00+14:00"},
     "window_end"),
    ({**_WINDOW, "window_start": "2020-01-01T00:00:00Z"}, "window_end"),
    # QA: a time without its offset was accepted here while as_of refuses it (which midnight?)
    ({**_WINDOW, "window_start": "2020-01-01T00:00:00", "window_end": "2020-02-01T00:00:00Z"},
     "window_start"),
    ({"period": "month", "limit": 5, "enforcement": "soft", "window_start": "2020-01-01T00:00:00Z"},
     "window_start"),
    ({"period": "month", "limit": -1, "enforcement": "soft"}, "limit"),
    ({"period": "decade", "limit": 5, "enforcement": "soft"}, "period"),
])
def test_bad_budget_bodies_are_400_and_write_nothing(tenant: Tenant, body: dict, field: str) -> None:
    response = send(client_for(tenant.admin), "put", f"/api/v1/orgs/{tenant.org.pk}/budget", body)
    assert response.status_code == 400, response.content
    assert response["Content-Type"] == "application/problem+json"
    assert field in response.json()["errors"]
    assert not Budget.objects.exists()


def test_window_times_compare_as_instants_across_offsets(tenant: Tenant) -> None:
    body = {**_WINDOW, "window_start": "2020-01-01T00:00:00+14:00", "window_end": "2020-01-01T00:00:00-12:00"}
    response = send(client_for(tenant.admin), "put", f"/api/v1/orgs/{tenant.org.pk}/budget", body)
    assert response.status_code == 201, response.content
    assert response.json()["window_start"] == "2019-12-31T10:00:00Z"
    assert response.json()["window_end"] == "2020-01-01T12:00:00Z"


@pytest.mark.django_db(transaction=True)
def test_concurrent_budget_puts_on_a_new_scope_leave_one_budget(tenant: Tenant) -> None:
    """Several PUTs with different Idempotency-Keys race to create the same scope's budget: every
    one succeeds (one creates, the others replace), never a 500, and one row remains."""
    from tests.api.concurrency import run_concurrently

    url = f"/api/v1/orgs/{tenant.org.pk}/budget"

    def put(limit: int) -> Any:
        def call() -> tuple[int, Any]:
            response = send(client_for(tenant.admin), "put", url,
                            {"period": "month", "limit": limit, "enforcement": "hard"})
            return response.status_code, response.json()
        return call

    results = run_concurrently([put(limit) for limit in range(1, 9)], threads=8)
    statuses = sorted(status for status, _ in results)
    assert statuses.count(201) >= 1 and set(statuses) <= {200, 201}, results
    budget = Budget.objects.get(org=tenant.org, project=None, user=None)
    assert budget.limit in range(1, 9)


def test_issuing_a_reference_again_says_nothing_new_was_issued(finance: APIClient, tenant: Tenant) -> None:
    """QA: the same reference and terms with a fresh Idempotency-Key answered 201 as if new."""
    body = {"amount": 7, "kind": "paid", "source": "purchase", "reference": "inv-9", "reason": "r"}
    first = send(finance, "post", f"/api/v1/orgs/{tenant.org.pk}/credits", body)
    again = send(finance, "post", f"/api/v1/orgs/{tenant.org.pk}/credits", body)  # another key
    assert (first.status_code, first.json()["already_issued"]) == (201, False)
    assert (again.status_code, again.json()["already_issued"]) == (200, True)
    assert again.json()["id"] == first.json()["id"]
    assert Bucket.objects.filter(org=tenant.org, reference="inv-9").count() == 1


def test_an_unknown_owner_is_a_400_naming_owner(finance: APIClient) -> None:
    """QA: a 404 "Not found." (the route exists; a field of the body is wrong), message lost."""
    inactive = UserFactory(is_active=False)
    for owner in ("nobody", inactive.username):
        response = send(finance, "post", "/api/v1/orgs", {"name": "Acme", "slug": "acme", "owner": owner})
        problem = response.json()
        assert (response.status_code, problem.get("type"), problem.get("errors")) == (
            400, "validation-error", {"owner": ["No such active user to make owner."]})
    assert not Organization.objects.filter(slug="acme").exists()


def test_credits_for_an_unknown_project_are_a_400_naming_project(finance: APIClient, tenant: Tenant) -> None:
    """QA: a 404 for the org's route, as though the org did not exist."""
    response = send(finance, "post", f"/api/v1/orgs/{tenant.org.pk}/credits", {
        "amount": 5, "kind": "paid", "source": "purchase", "reference": "r", "reason": "r",
        "project": 10**9})
    problem = response.json()
    assert (response.status_code, problem.get("type"), problem.get("errors")) == (
        400, "validation-error", {"project": ["No such project."]})
    assert Bucket.objects.filter(org=tenant.org).count() == 1


def test_credits_for_another_orgs_project_are_a_400_under_project(finance: APIClient, tenant: Tenant) -> None:
    """QA: a 400 without `errors`, unlike an unknown project's `errors.project`."""
    other = make_tenant()
    response = send(finance, "post", f"/api/v1/orgs/{tenant.org.pk}/credits", {
        "amount": 5, "kind": "paid", "source": "purchase", "reference": "r", "reason": "r",
        "project": other.project.pk})
    problem = response.json()
    assert (response.status_code, problem.get("type"), problem.get("errors")) == (
        400, "validation-error", {"project": ["The project belongs to another organization."]})
    assert Bucket.objects.filter(org=tenant.org).count() == 1


def test_credits_with_a_null_project_are_for_the_whole_org(finance: APIClient, tenant: Tenant) -> None:
    """QA: `"project": null` was a 400 although the field is optional."""
    response = send(finance, "post", f"/api/v1/orgs/{tenant.org.pk}/credits", {
        "amount": 5, "kind": "paid", "source": "purchase", "reference": "null-project", "reason": "r",
        "project": None})
    assert response.status_code == 201, response.content
    assert response.json()["project"] is None
    assert Bucket.objects.get(org=tenant.org, reference="null-project").project_id is None


@pytest.mark.parametrize("reference", ["inv\n7", "inv\x007", "refund:job:1:k", "REFUND:job:1:k"])
def test_a_bad_reference_is_refused_in_one_shape(finance: APIClient, tenant: Tenant, reference: str) -> None:
    """QA: a control character was `invalid-parameter` with a top-level `field`, a NUL a
    `validation-error` under `errors.reference`; both (and a reference kept for refunds) are now the
    latter."""
    body = {"amount": 5, "kind": "paid", "source": "purchase", "reference": reference, "reason": "r"}
    response = send(finance, "post", f"/api/v1/orgs/{tenant.org.pk}/credits", body)
    assert response.status_code == 400, response.json()
    assert response.json()["type"].endswith("validation-error") and "reference" in response.json()["errors"]
