"""A budget set while holds of its org are being placed, on real connections (budgets/scope_lock.py).

Before: a submission in flight when a budget was set had read the budgets before the new one
existed, and the budget's seeding could not see its uncommitted hold, so no period of the new
budget counted it (the budget could be overshot by it). Now the setting waits for it, and a
submission that starts while a budget is being set waits and then reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from budgets.errors import BudgetExceeded
from budgets.models import BudgetCharge, BudgetPeriod
from budgets.services import set_budget
from scheduling.core import reasons
from scheduling.models import Job
from scheduling.services.lifecycle import fund_job
from scheduling.services.submission import JobSpec, submit_job
from scheduling.services.submission_sql import submit_job_in_sql
from tests.api.factories import Tenant
from tests.lock_waits import another_session_waits

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = JobSpec(name="train", gpu_types=("H100",), gpu_count=1, max_wall_seconds=600,
               priority_class="standard")


def _in_thread(
    work: Callable[[], Any], errors: list[BaseException], done: threading.Event
) -> threading.Thread:
    def run() -> None:
        try:
            work()
        except BaseException as error:  # reported by the test
            errors.append(error)
        finally:
            done.set()
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _submit(tenant: Tenant, path: str, key: str) -> int:
    """Submit SPEC by one of the two submission paths; the placed hold's amount."""
    if path == "sql":
        submitted = submit_job_in_sql(user=tenant.user, project=tenant.project, spec=SPEC,
                                      idempotency_key=key, principal=f"user:{tenant.user.pk}",
                                      fingerprint="f")
        assert submitted is not None  # accepted in one statement, not declined to the Python path
        return submitted.hold.authorized
    job = submit_job(user=tenant.user, project=tenant.project, spec=SPEC, idempotency_key=key)
    return job.current_hold.authorized


@pytest.mark.parametrize("path", ["sql", "python"])
def test_a_budget_set_while_a_submission_is_in_flight_counts_its_hold(tenant: Tenant, path: str) -> None:
    amounts: list[int] = []
    errors: list[BaseException] = []
    submitted, commit = threading.Event(), threading.Event()
    submission_done, setting_done = threading.Event(), threading.Event()

    def submission() -> None:
        with transaction.atomic():
            amounts.append(_submit(tenant, path, "in-flight"))
            submitted.set()
            commit.wait(10)  # in flight: the hold is placed, not committed

    first = _in_thread(submission, errors, submission_done)
    assert submitted.wait(10), errors
    second = _in_thread(lambda: set_budget(org=tenant.org, period="month", limit=10**15,
                                           enforcement="hard"), errors, setting_done)
    # The setting waits for the submission (before the lock it finished at once, counting 0).
    waited = another_session_waits(setting_done, wait_event="advisory")
    commit.set()
    first.join(15), second.join(15)
    assert not errors
    period = BudgetPeriod.objects.get(budget__org=tenant.org)
    assert period.held == amounts[0] > 0
    assert list(BudgetCharge.objects.filter(period=period).values_list("held", flat=True)) == amounts
    assert waited  # the setting waited on the org's lock until the submission committed


def test_a_submission_during_a_budget_setting_waits_and_meets_the_budget(tenant: Tenant) -> None:
    errors: list[BaseException] = []
    set_, commit = threading.Event(), threading.Event()
    setting_done, submission_done = threading.Event(), threading.Event()

    def setting() -> None:
        with transaction.atomic():
            set_budget(org=tenant.org, period="month", limit=1, enforcement="hard")
            set_.set()
            commit.wait(10)

    first = _in_thread(setting, errors, setting_done)
    assert set_.wait(10), errors
    refused: list[BudgetExceeded] = []

    def submission() -> None:
        try:
            _submit(tenant, "python", "during")
        except BudgetExceeded as error:
            refused.append(error)

    second = _in_thread(submission, errors, submission_done)
    waited = another_session_waits(submission_done, wait_event="advisory")
    commit.set()
    first.join(15), second.join(15)
    assert not errors
    # Refused by the budget it waited for (before the lock: read before the budget committed, the
    # 1-micro-credit budget was not there, and the submission was accepted past it).
    assert len(refused) == 1 and refused[0].level == "org"
    assert not Job.objects.filter(org=tenant.org).exists()
    assert waited


def test_a_requeued_job_does_not_wait_for_a_budget_being_set(tenant: Tenant) -> None:
    """Funding a requeued job may hold other holds of the org, which the setting waits for, so it
    does not wait: the job waits `budget` and is funded on a later try."""
    job = submit_job(user=tenant.user, project=tenant.project, spec=SPEC, idempotency_key="first")
    Job.objects.filter(pk=job.pk).update(current_hold=None)  # as after a requeue refused funding
    job.refresh_from_db()
    errors: list[BaseException] = []
    set_, commit, done = threading.Event(), threading.Event(), threading.Event()

    def setting() -> None:
        with transaction.atomic():
            set_budget(org=tenant.org, period="month", limit=10**15, enforcement="hard")
            set_.set()
            commit.wait(10)

    thread = _in_thread(setting, errors, done)
    assert set_.wait(10), errors
    try:
        with transaction.atomic():
            assert fund_job(job=job) is False
        job.refresh_from_db()
        assert job.current_hold_id is None and job.wait_reason == reasons.BUDGET
        assert "being set" in job.wait_detail
    finally:
        commit.set()
        thread.join(15)
    assert not errors
    with transaction.atomic():
        assert fund_job(job=job) is True
    period = BudgetPeriod.objects.get(budget__org=tenant.org)
    job.refresh_from_db()
    assert period.held == job.current_hold.authorized + _first_hold(job)


def _first_hold(job: Job) -> int:
    """The first submission's hold (still active: this test dropped the job's pointer to it)."""
    from ledger.models import Hold

    return Hold.objects.get(reference=f"job:{job.pk}", key__endswith=":submit").authorized
