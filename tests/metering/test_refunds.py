"""Crediting (refunding) a job: capped by its captures, linked to the job, on the statement, in the
API for finance, in the admin, and safe under concurrent requests (real threads, PostgreSQL)."""

from __future__ import annotations

import csv
import io
import re
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import transaction

from audit.models import AuditEvent
from ledger.errors import IdempotencyConflict, RefundExceedsCharges
from ledger.models import MICRO, Bucket, BucketKind, BucketSource, LedgerTransaction, TransactionKind
from ledger.services import capture, issue_credits
from ledger.statements import org_statement
from ledger.verification import verify_ledger
from scheduling.models import Job, JobAttempt, JobRefund
from scheduling.services.lifecycle import lock_job
from scheduling.services.refunds import refund_job
from tests.api.conftest import client_for
from tests.factories import OrgMembershipFactory, UserFactory
from tests.lock_waits import another_session_waits
from tests.metering.conftest import World, ensure_priority_classes
from tests.threads import Worker


def _charged_job(make_attempt: Callable[..., JobAttempt], funded: Callable[..., Any], charge: int = 4 * MICRO,
                 ) -> JobAttempt:
    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=10 * MICRO)
    capture(hold=attempt.hold, amount=charge, key="run")
    return attempt


def _finance_user(**kw: Any) -> Any:
    user = UserFactory(**kw)
    user.groups.add(Group.objects.get_or_create(name="finance")[0])
    return user


def _post(client: Any, job_id: int, body: dict[str, Any], key: str | None = None) -> Any:
    return client.post(f"/api/v1/jobs/{job_id}/refund", body, format="json",
                       HTTP_IDEMPOTENCY_KEY=key or uuid.uuid4().hex)


@pytest.mark.django_db
def test_a_refund_is_a_new_paid_bucket_linked_to_the_job(make_attempt, funded, world: World) -> None:
    attempt = _charged_job(make_attempt, funded)
    actor = _finance_user()
    refund = refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node", key="k1", actor=actor)
    bucket = refund.bucket
    assert (bucket.kind, bucket.source, bucket.expires_at) == (BucketKind.PAID, BucketSource.REFUND, None)
    assert bucket.reference == f"refund:job:{attempt.job_id}:k1" and bucket.available == 3 * MICRO
    assert refund.job_id == attempt.job_id and refund.created_by == actor and refund.reason == "bad node"
    txn = LedgerTransaction.objects.get(kind=TransactionKind.REFUND)
    assert txn.params["job"] == attempt.job_id and txn.amount == 3 * MICRO
    event = AuditEvent.objects.get(action="ledger.refund")
    assert event.amount == 3 * MICRO and event.data["job"] == attempt.job_id
    assert verify_ledger() == []
    # The same key again is the same refund; a different request with it is a conflict.
    again = refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node", key="k1", actor=actor)
    assert again.pk == refund.pk and again.replayed
    with pytest.raises(IdempotencyConflict):
        refund_job(job_id=attempt.job_id, amount=2 * MICRO, reason="bad node", key="k1", actor=actor)
    # Never more than charged, counting what was refunded already (job and attempt alike).
    with pytest.raises(RefundExceedsCharges):
        refund_job(job_id=attempt.job_id, amount=MICRO + 1, reason="more", key="k2")
    with pytest.raises(RefundExceedsCharges):
        refund_job(job_id=attempt.job_id, amount=MICRO + 1, reason="more", key="k3", attempt_number=1)
    refund_job(job_id=attempt.job_id, amount=MICRO, reason="rest", key="k4", attempt_number=1)
    assert Bucket.objects.filter(source=BucketSource.REFUND).count() == 2
    # A grant cannot pose as a refund.
    with pytest.raises(Exception, match="crediting a job"):
        issue_credits(org=world.org, amount=1, kind="paid", source="refund", reference="x", reason="x")


@pytest.mark.django_db
def test_the_statement_shows_refunds_apart_from_issues(make_attempt, funded, world: World) -> None:
    attempt = _charged_job(make_attempt, funded)
    refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node", key="k1")
    month = LedgerTransaction.objects.get(kind=TransactionKind.REFUND).created_at.strftime("%Y-%m")
    statement = org_statement(org=world.org, month=month)
    assert statement.issued == 100 * MICRO and statement.refunded == 3 * MICRO
    assert statement.closing.total == (statement.opening.total + statement.issued + statement.refunded
                                       - statement.consumed - statement.expired - statement.voided)
    (line,) = statement.refunds
    assert (line.job_id, line.attempt, line.amount) == (attempt.job_id, None, 3 * MICRO)
    assert line.reason == "bad node"
    assert all(issue.source != BucketSource.REFUND for issue in statement.issues)
    api = client_for(_finance_user())
    body = api.get(f"/api/v1/orgs/{world.org.pk}/statement", {"month": month}).json()
    assert body["refunded"] == 3 * MICRO and body["refunds"][0]["job"] == attempt.job_id
    assert body["issued"] == 100 * MICRO
    rows = list(csv.reader(io.StringIO(api.get(f"/api/v1/orgs/{world.org.pk}/statement",
                                               {"month": month, "format": "csv"}).content.decode())))
    reference = f"refund:job:{attempt.job_id}:k1"
    assert ["refunded", "", "", reference, str(3 * MICRO), "", body["refunds"][0]["at"]] in rows
    assert ["total refunded", "", "", "", str(3 * MICRO), "", ""] in rows


@pytest.mark.django_db
def test_the_api_refunds_for_finance_only(make_attempt, funded, world: World) -> None:
    attempt = _charged_job(make_attempt, funded)
    job_id = attempt.job_id
    finance = client_for(_finance_user())
    OrgMembershipFactory(org=world.org, user=world.user, role="owner")
    member = client_for(world.user)  # the org's owner: reads the job, may not refund it
    assert _post(member, job_id, {"amount": MICRO, "reason": "x"}).status_code == 403
    assert finance.post(f"/api/v1/jobs/{job_id}/refund", {"amount": MICRO, "reason": "x"},
                        format="json").status_code == 400  # no Idempotency-Key
    assert _post(finance, 999_999, {"amount": MICRO, "reason": "x"}).status_code == 404
    for bad in ({"amount": 0, "reason": "x"}, {"amount": MICRO}, {"amount": MICRO, "reason": ""},
                {"amount": "1", "reason": "x"}, {"amount": MICRO, "reason": "x", "attempt": 7},
                {"amount": MICRO, "reason": "x", "extra": 1}):
        response = _post(finance, job_id, bad)
        assert response.status_code == 400, (bad, response.json())
        assert response["Content-Type"].startswith("application/problem+json")
    over = _post(finance, job_id, {"amount": 5 * MICRO, "reason": "x"})
    assert over.status_code == 409 and over.json()["type"] == "refund-exceeds-charges"
    done = _post(finance, job_id, {"amount": 3 * MICRO, "reason": "bad node", "attempt": 1}, key="key-1")
    assert done.status_code == 201, done.json()
    assert done.json()["attempt"] == 1 and done.json()["job_charged"] == 4 * MICRO
    reference = done.json()["reference"]  # keys are the caller's: refund:job:<id>:<user id>:<key>
    assert reference.startswith(f"refund:job:{job_id}:") and reference.endswith(":key-1")
    replay = _post(finance, job_id, {"amount": 3 * MICRO, "reason": "bad node", "attempt": 1}, key="key-1")
    assert replay.status_code == 201 and replay["Idempotent-Replayed"] == "true"
    assert JobRefund.objects.count() == 1
    detail = member.get(f"/api/v1/jobs/{job_id}").json()
    assert detail["refunded"] == 3 * MICRO and detail["attempts"][0]["charged"] == 4 * MICRO
    balance = finance.get(f"/api/v1/orgs/{world.org.pk}/balance").json()
    assert any(b["source"] == "refund" and b["available"] == 3 * MICRO for b in balance["buckets"])


@pytest.mark.django_db
def test_the_admin_action_credits_a_job(client, make_attempt, funded) -> None:
    attempt = _charged_job(make_attempt, funded)
    user = _finance_user(is_staff=True)
    client.force_login(user)
    url = "/admin/scheduling/job/"
    assert client.get(url).status_code == 200
    actions = client.get(url).context["action_form"].fields["action"].choices
    names = [name for name, _ in actions]
    assert "refund" in names and "cancel" not in names  # finance credits jobs, does not operate them
    form = client.post(url, {"action": "refund", "_selected_action": [attempt.job_id]})
    assert form.status_code == 200 and b"May still be refunded" in form.content
    key = form.context["form"]["key"].value()
    body = {"action": "refund", "_selected_action": [attempt.job_id], "apply": "1", "credits": "2.5",
            "reason": "bad node", "key": key}
    too_much = client.post(url, {**body, "credits": "5"})
    assert too_much.status_code == 200 and b"refunded already" in too_much.content
    assert client.post(url, body).status_code == 302
    assert client.post(url, body).status_code == 302  # the same form twice: one refund
    (refund,) = JobRefund.objects.all()
    assert refund.amount == 2_500_000 and refund.created_by == user and refund.key == f"admin:{key}"
    assert client.post(url, {**body, "reason": ""}).status_code == 200  # reason is mandatory
    assert JobRefund.objects.count() == 1
    page = client.get(f"{url}{attempt.job_id}/change/").content.decode()
    shown = r"{} \(credits\):</label>\s*<div class=\"readonly\">{}<"
    assert re.search(shown.format("charged", r"4\.00"), page, re.I), "its charges"
    assert re.search(shown.format("refunded", r"2\.50"), page, re.I), "its refunds"
    staff = UserFactory(is_staff=True)
    client.force_login(staff)
    assert client.get(url).status_code == 403


@pytest.mark.django_db(transaction=True)
def test_concurrent_refunds_never_exceed_the_charges(make_attempt, funded) -> None:
    ensure_priority_classes()
    attempt = _charged_job(make_attempt, funded, charge=4 * MICRO)
    job_id = attempt.job_id
    gate_locked, release_gate = threading.Event(), threading.Event()

    def gate() -> None:
        with transaction.atomic():
            lock_job(job_id)
            gate_locked.set()
            release_gate.wait(20)

    def refund(n: int) -> Any:
        return refund_job(job_id=job_id, amount=3 * MICRO, reason="bad node", key=f"race-{n}")

    gatekeeper = Worker(gate).start()
    assert gate_locked.wait(10)
    workers = [Worker(lambda n=n: refund(n)).start() for n in range(2)]
    # Both read the charges only once they get the job lock: wait until both are blocked on it.
    both_wait = another_session_waits(threading.Event(), sessions=2)
    release_gate.set()
    gatekeeper.join()
    for worker in workers:
        worker.join()
    assert both_wait, "the refunds did not both wait for the job lock: no race"
    succeeded = [w for w in workers if not w.errors]
    failed = [w for w in workers if w.errors]
    assert len(succeeded) == 1 and len(failed) == 1
    assert isinstance(failed[0].errors[0], RefundExceedsCharges)
    assert sum(JobRefund.objects.filter(job_id=job_id).values_list("amount", flat=True)) == 3 * MICRO
    assert Job.objects.get(pk=job_id).refunds.count() == 1
    assert verify_ledger() == []
