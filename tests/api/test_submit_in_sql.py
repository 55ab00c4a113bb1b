"""`jobs_submit` (ADR 0006): an accepted submission is one statement, with exactly the Python
path's effects; every other outcome is declined to the Python path and answered as before."""

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import IdempotencyRecord, OrgRole
from audit.models import AuditEvent
from budgets.models import BudgetCharge, BudgetPeriod
from budgets.services import set_budget
from ledger.models import MICRO, Bucket, BucketKind, Hold, HoldLine, LedgerTransaction, Posting
from ledger.verification import verify_ledger
from scheduling.models import GpuPrice, GpuType, Job
from scheduling.services import submission_sql
from tests.api.conftest import client_for
from tests.api.factories import Tenant, add_member, grant, make_tenant
from tests.factories import fund

pytestmark = pytest.mark.django_db


def _body(tenant: Tenant, **overrides: Any) -> dict[str, Any]:
    body = {"project": tenant.project.pk, "name": "train", "gpu_types": ["H100", "A100"],
            "gpu_count": 2, "gpu_memory_gb": 40, "max_wall_seconds": 3600, "priority_class": "standard"}
    return {**body, **overrides}


def _post(api: APIClient, body: dict, key: str | None = None) -> tuple[Any, list[str]]:
    with CaptureQueriesContext(connection) as queries:
        response = api.post("/api/v1/jobs", body, format="json",
                            HTTP_IDEMPOTENCY_KEY=key or uuid.uuid4().hex)
    return response, [q["sql"] for q in queries.captured_queries]


def _in_sql(statements: list[str]) -> bool:
    return any("jobs_submit(" in sql for sql in statements)


def _python_path(statements: list[str]) -> bool:
    return any(sql.startswith('INSERT INTO "scheduling_job"') for sql in statements)


def _rich_tenant(now: Any) -> Tenant:
    """Buckets in several spend-order positions and budgets at every level, all with room."""
    tenant = make_tenant()
    grant(tenant.org)
    fund(tenant.org, 3 * MICRO, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(days=2))
    fund(tenant.org, 5 * MICRO, project=tenant.project, expires_at=now + timedelta(days=30))
    fund(tenant.org, 4 * MICRO, gpu_types=("A100", "H100"))
    fund(tenant.org, 500 * MICRO)
    set_budget(org=tenant.org, period="month", limit=10**12, enforcement="hard")
    set_budget(org=tenant.org, project=tenant.project, period="window", limit=10**12, enforcement="soft",
               window_start=now - timedelta(days=1), window_end=now + timedelta(days=1))
    set_budget(org=tenant.org, project=tenant.project, user=tenant.user, period="month", limit=10**12,
               enforcement="hard")
    return tenant


def _effects(tenant: Tenant) -> dict[str, Any]:
    """Everything the tenant's submissions wrote, with database ids replaced by their rank."""
    jobs = list(Job.objects.filter(org=tenant.org).order_by("id"))
    job_no = {job.pk: n for n, job in enumerate(jobs)}
    bucket_no = {pk: n for n, pk in enumerate(Bucket.objects.filter(org=tenant.org).order_by("id")
                                             .values_list("pk", flat=True))}
    holds = list(Hold.objects.filter(org=tenant.org).order_by("id"))
    hold_no = {hold.pk: n for n, hold in enumerate(holds)}
    txns = list(LedgerTransaction.objects.filter(org_id=tenant.org.pk, kind="hold").order_by("id"))
    txn_no = {txn.pk: n for n, txn in enumerate(txns)}

    def named(text: str) -> str:
        for pk, n in job_no.items():
            text = text.replace(f"job:{pk}", f"job:#{n}")
        return text

    skip = {"id", "org_id", "project_id", "user_id", "current_hold_id", "submitted_at", "updated_at"}
    events = []
    for event in AuditEvent.objects.filter(org_id=tenant.org.pk, action="sched.job.submit").order_by("seq"):
        data = dict(event.data)
        data["hold"], data["transaction"] = hold_no[data["hold"]], txn_no[data["transaction"]]
        data["buckets"] = {bucket_no[int(pk)]: take for pk, take in data["buckets"].items()}
        data["key"], data["reference"] = named(data["key"]), named(data["reference"])
        assert data.pop("project") == tenant.project.pk
        events.append((event.actor_type, event.actor_id == str(tenant.user.pk), event.subject_type,
                       job_no[int(event.subject_id)], event.amount, event.reason_code, data))
    records = []
    for record in IdempotencyRecord.objects.filter(principal=f"user:{tenant.user.pk}").order_by("id"):
        body = dict(record.response_body)
        body["id"], body["hold"] = job_no[body["id"]], {**body["hold"], "id": hold_no[body["hold"]["id"]]}
        for field in ("org", "project", "user", "submitted_at", "updated_at"):
            body.pop(field)
        body["hold"].pop("created_at")
        records.append((record.key, record.state, record.response_status, body))
    return {
        "jobs": [({k: v for k, v in vars(job).items() if k not in skip and not k.startswith("_")},
                  hold_no[job.current_hold_id]) for job in jobs],
        "holds": [(named(h.key), named(h.reference), h.gpu_types, h.state, h.authorized, h.captured,
                   h.released, h.project_id == tenant.project.pk, h.user_id == tenant.user.pk)
                  for h in holds],
        "lines": [(hold_no[line.hold_id], bucket_no[line.bucket_id], line.authorized)
                  for line in HoldLine.objects.filter(hold__org=tenant.org).order_by("id")],
        "journal": [(named(t.key), named(t.memo), t.amount, {
            **t.params, "reference": named(t.params["reference"]),
            "project": t.params["project"] == tenant.project.pk, "user": t.params["user"] == tenant.user.pk,
        }) for t in txns],
        "postings": [(txn_no[p.transaction_id], p.account, bucket_no[p.bucket_id], p.amount)
                     for p in Posting.objects.filter(transaction__in=txns).order_by("id")],
        "buckets": list(Bucket.objects.filter(org=tenant.org).order_by("id")
                        .values_list("available", "held")),
        "periods": list(BudgetPeriod.objects.filter(org_id=tenant.org.pk).order_by("budget__level", "id")
                        .values_list("budget__level", "starts_at", "ends_at", "held", "spent")),
        "charges": sorted((c.period.budget.level, hold_no[c.hold_id], c.held, c.spent) for c in
                          BudgetCharge.objects.filter(hold__org=tenant.org).select_related("period__budget")),
        "events": events,
        "records": records,
    }


def test_accepted_submissions_write_what_the_python_path_writes(fleet: dict[str, GpuType],
                                                                  settings: Any) -> None:
    effects, paths, now = [], [], timezone.now()
    for in_sql in (True, False):
        settings.JOBS_SUBMIT_IN_SQL = in_sql
        tenant = _rich_tenant(now)
        api = client_for(tenant.user)
        overrides_each = [{}, {"gpu_types": ["A100"], "gpu_memory_gb": 0, "command": "run ✓"},
                          {"priority_class": "production", "preemptible": False}, {"max_wall_seconds": 7200}]
        for n, overrides in enumerate(overrides_each):
            if n == 3:  # a hold of one window (30 min), an estimate of the whole max wall time (2 h)
                tenant.org.hold_window_seconds = 1800
                tenant.org.save(update_fields=["hold_window_seconds"])
            response, statements = _post(api, _body(tenant, **overrides), key=f"key-{n}")
            assert response.status_code == 201, response.json()
            paths.append((_in_sql(statements), _python_path(statements)))
        effects.append(_effects(tenant))
    assert paths == [(True, False)] * 4 + [(False, True)] * 4
    assert effects[0] == effects[1]
    windowed = effects[0]["jobs"][3][0]
    assert windowed["estimate"] == 4 * effects[0]["holds"][3][4]  # 2 h priced, 30 min held
    assert len(effects[0]["lines"]) > 3  # the holds drew on several buckets in spend order
    assert verify_ledger() == []


def test_a_replay_of_a_one_statement_submission(api: APIClient, job_body: Callable) -> None:
    first, statements = _post(api, job_body(), key="same")
    assert first.status_code == 201 and _in_sql(statements)
    again, statements = _post(api, job_body(), key="same")
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    other, _ = _post(api, job_body(name="other"), key="same")
    assert other.status_code == 422 and other.json()["type"].endswith("idempotency-key-reused")
    assert Job.objects.count() == 1 and Hold.objects.count() == 1


def _both_paths(settings: Any, make: Callable[[], Tenant], body: Callable[[Tenant], dict]) -> list[Any]:
    """The answers of the same refused request with and without the one-statement path."""
    answers = []
    for in_sql in (True, False):
        settings.JOBS_SUBMIT_IN_SQL = in_sql
        tenant = make()
        response, statements = _post(client_for(tenant.user), body(tenant))
        assert _in_sql(statements) is in_sql and _python_path(statements)  # declined: Python decided
        answer = response.json()
        for varying in ("instance", "request_id", "budget_id"):
            answer.pop(varying, None)
        answers.append((response.status_code, answer, Job.objects.filter(org=tenant.org).count(),
                        IdempotencyRecord.objects.filter(principal=f"user:{tenant.user.pk}").count()))
    return answers


def test_a_hard_budget_refusal_is_the_python_paths(fleet: dict[str, GpuType], settings: Any) -> None:
    def make() -> Tenant:
        tenant = make_tenant(funds=100 * MICRO)
        set_budget(org=tenant.org, project=tenant.project, user=tenant.user, period="month",
                   limit=MICRO, enforcement="hard")
        return tenant

    in_sql, python = _both_paths(settings, make, _body)
    assert in_sql == python
    assert in_sql[0] == 402 and in_sql[1]["type"].endswith("budget-exceeded") and in_sql[2:] == (0, 0)


def test_insufficient_credits_is_the_python_paths(fleet: dict[str, GpuType], settings: Any) -> None:
    in_sql, python = _both_paths(settings, lambda: make_tenant(funds=MICRO), _body)
    assert in_sql == python
    assert in_sql[0] == 402 and in_sql[1]["type"].endswith("insufficient-credits") and in_sql[2:] == (0, 0)


def test_a_soft_budget_crossing_takes_the_python_path_and_alerts(fleet: dict[str, GpuType]) -> None:
    tenant = make_tenant(funds=100 * MICRO)
    set_budget(org=tenant.org, project=tenant.project, period="month", limit=MICRO, enforcement="soft")
    response, statements = _post(client_for(tenant.user), _body(tenant))
    assert response.status_code == 201 and _in_sql(statements) and _python_path(statements)
    alert = AuditEvent.objects.get(org_id=tenant.org.pk, action="budget.soft_limit_exceeded")
    assert alert.data["level"] == "project" and alert.data["hold"] == response.json()["hold"]["id"]
    assert (alert.actor_type, alert.actor_id) == ("user", str(tenant.user.pk))  # QA: was "System"


def test_a_price_change_after_pricing_takes_the_python_path(fleet: dict[str, GpuType], tenant: Tenant,
                                                             monkeypatch: Any) -> None:
    """The hold is priced at the transaction's clock: a price that took effect between the
    caller's pricing (here, an hour ago by its clock) and the statement sends it to Python."""
    now = timezone.now()
    GpuPrice.objects.create(gpu_type=fleet["H100"], effective_from=now - timedelta(minutes=30),
                            price_per_gpu_hour=10 * MICRO)
    monkeypatch.setattr(submission_sql.timezone, "now", lambda: now - timedelta(hours=1))
    response, statements = _post(client_for(tenant.user), _body(tenant))
    assert response.status_code == 201 and _in_sql(statements) and _python_path(statements)
    assert response.json()["estimate"] == 2 * 10 * MICRO  # 2 GPUs x 1 h at the new price


def test_a_scheduled_price_is_used_until_it_takes_effect(fleet: dict[str, GpuType], tenant: Tenant) -> None:
    GpuPrice.objects.create(gpu_type=fleet["H100"], effective_from=timezone.now() + timedelta(hours=1),
                            price_per_gpu_hour=10 * MICRO)
    response, statements = _post(client_for(tenant.user), _body(tenant))
    assert response.status_code == 201 and _in_sql(statements) and not _python_path(statements)
    assert response.json()["estimate"] == 2 * 4 * MICRO  # the H100 price in effect now


def test_invalid_and_forbidden_requests_take_the_python_path(fleet: dict[str, GpuType],
                                                             tenant: Tenant) -> None:
    api = client_for(tenant.user)
    response, statements = _post(api, _body(tenant, gpu_types=["H100", "H100"]))
    assert response.status_code == 400 and not _in_sql(statements)
    response, statements = _post(api, _body(tenant, regions=["eu", "eu"]))  # QA: was 201
    assert response.status_code == 400 and not _in_sql(statements)
    assert response.json()["errors"] == {"regions": ["Regions must not repeat."]}
    viewer = add_member(tenant.project, role=OrgRole.VIEWER)
    response, statements = _post(client_for(viewer), _body(tenant))
    assert response.status_code == 403 and not _in_sql(statements) and not _python_path(statements)
    response, statements = _post(client_for(tenant.admin), _body(tenant))  # org admins may submit
    assert response.status_code == 201 and _in_sql(statements)


def test_a_hard_window_being_opened_is_the_python_paths_retryable_refusal(
    fleet: dict[str, GpuType], settings: Any
) -> None:
    """Review: between a window's start and its opening (the beat task counting the holds placed
    before the start), a hard window was checked against a partial count and could be overspent;
    both paths now refuse a new hold for those seconds (409, Retry-After), and nothing is written."""
    from budgets.models import Budget

    def make() -> Tenant:
        tenant = make_tenant(funds=100 * MICRO)
        now = timezone.now()
        budget, _ = set_budget(org=tenant.org, project=tenant.project, period="window", limit=10**12,
                               enforcement="hard", window_start=now - timedelta(minutes=1),
                               window_end=now + timedelta(hours=1))
        Budget.objects.filter(pk=budget.pk).update(window_opened=False)  # begun, not yet counted
        return tenant

    in_sql, python = _both_paths(settings, make, _body)
    assert in_sql == python
    assert in_sql[0] == 409 and in_sql[1]["type"].endswith("budget-window-opening") and in_sql[2:] == (0, 0)
    assert in_sql[1]["retry_after"] == 5
