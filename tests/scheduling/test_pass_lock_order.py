"""A scheduling pass that tops up or releases several holds of one org, while a submission in the
same org takes its locks, on real connections from two threads: neither is aborted as a deadlock.

A submission (and a charge) locks its budget periods, then the org's buckets. The pass once took
them hold by hold: the first top-up locked the org's buckets, and the next top-up (or an excess
release) then locked another project's budget period — held by a submission that was waiting for
those buckets. PostgreSQL aborted one of the two (40P01). Now the pass takes every period, then
every bucket, before its first top-up (`repricing.lock_ledger_ahead`).

The same with buckets alone, in an org without budgets: the pass's top-up locked the org's
buckets with credits available, and its excess release then a bucket the released hold had
emptied, of a lower id, which a cancel of another job (whose hold drew on both) held while waiting
for the first. Now the pass locks all those buckets at once, by id.

The hook runs the intruder at the point where the old order inverted, and waits until it is
blocked on a lock before letting the pass go on. Neither side retries here: a deadlock fails the
test. Each case failed before the fix. And a bucket empty when the pass locks ahead, refilled by a
cancel before the top-up, is one the top-up would then lock out of order (review): every unexpired
bucket of the org is locked ahead."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from accounts.models import Project
from budgets.services import set_budget
from config.clock import db_now
from ledger.verification import verify_ledger
from scheduling.adapter import repricing, writer
from scheduling.models import GpuPrice, Job, JobAttempt, JobState, Node, NodeState
from scheduling.services.holding import hold_job
from scheduling.services.lifecycle import cancel_job
from scheduling.services.submission import JobSpec, submit_job
from scheduling.services.tick import run_scheduling_pass
from tests.api.factories import Tenant, make_tenant
from tests.factories import MembershipFactory, ProjectFactory, fund
from tests.lock_waits import another_session_waits
from tests.scheduling.conftest import H100_PRICE
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def _spec(*gpu_types: str) -> JobSpec:
    return JobSpec(name="train", gpu_types=gpu_types, gpu_count=1, max_wall_seconds=3600,
                   priority_class="standard")


def _submit(tenant: Tenant, project: Project, key: str, *gpu_types: str) -> Job:
    with transaction.atomic():  # no retry inside a caller's transaction: a deadlock would raise
        return submit_job(user=tenant.user, project=project, spec=_spec(*gpu_types), idempotency_key=key)


class Intruder(Worker):
    """A submission in `project` (or other `work`) in a transaction of its own, started from inside
    the pass; the pass goes on once it waits for a lock."""

    def __init__(self, tenant: Tenant, project: Project, work: Callable[[], Job] | None = None) -> None:
        run = work or (lambda: _submit(tenant, project, "intruder", "H100"))

        def in_transaction() -> Job:
            with transaction.atomic():
                return run()

        super().__init__(in_transaction)
        self.blocked = False

    @property
    def job(self) -> Job | None:
        return self.result

    def start_and_wait(self) -> None:
        self.start()
        self.blocked = another_session_waits(self.done)


@pytest.fixture
def org(fleet: dict[str, Any]) -> tuple[Tenant, Project]:
    """An org with two projects, the user a member of both, each with a monthly project budget."""
    tenant = make_tenant(funds=10**12)
    other = ProjectFactory(org=tenant.org)
    MembershipFactory(project=other, user=tenant.user)
    for project in (tenant.project, other):
        set_budget(org=tenant.org, project=project, period="month", limit=10**11, enforcement="hard")
    Node.objects.create(name="a100-1", region=fleet["region"], gpu_type=fleet["a100"], gpu_count=8,
                        state=NodeState.READY, last_heartbeat_at=db_now(), ib_group="ib1")
    return tenant, other


def _raise_h100(fleet: dict[str, Any]) -> None:
    GpuPrice.objects.create(gpu_type=fleet["h100"], price_per_gpu_hour=2 * H100_PRICE,
                            effective_from=db_now() - timedelta(seconds=1))


def test_a_second_top_up_does_not_deadlock_with_a_submission(
    fleet: dict[str, Any], org: tuple[Tenant, Project], monkeypatch: pytest.MonkeyPatch,
) -> None:
    tenant, other = org
    jobs = {_submit(tenant, project, f"job-{n}", "H100").pk: project
            for n, project in enumerate((tenant.project, other))}
    _raise_h100(fleet)  # both holds are now short of their runs: two top-ups
    intruders: list[Intruder] = []
    top_up = repricing._top_up

    def then_submit_in_the_next_ones_project(place: Any, *args: Any) -> str:
        refusal = top_up(place, *args)
        if not intruders:  # the first top-up has locked the org's buckets
            (next_project,) = [p for job_id, p in jobs.items() if job_id != place.job_id]
            intruders.append(Intruder(tenant, next_project))
            intruders[0].start_and_wait()
        return refusal

    monkeypatch.setattr(repricing, "_top_up", then_submit_in_the_next_ones_project)
    run_scheduling_pass.__wrapped__(trigger="race")  # no retry: a deadlock fails the test

    (intruder,) = intruders
    intruder.join()
    assert intruder.blocked and intruder.errors == [] and intruder.job is not None
    assert set(Job.objects.filter(pk__in=jobs).values_list("state", flat=True)) == {JobState.SCHEDULED}
    assert JobAttempt.objects.filter(rate_per_gpu_hour=2 * H100_PRICE).count() == 2  # both topped up
    assert verify_ledger() == []


def test_an_excess_release_after_a_top_up_does_not_deadlock_with_a_submission(
    fleet: dict[str, Any], org: tuple[Tenant, Project], monkeypatch: pytest.MonkeyPatch,
) -> None:
    tenant, other = org
    # Held at the dearest type it accepts (H100), placed on the one it prefers (A100): an excess.
    cheaper = _submit(tenant, tenant.project, "cheaper", "A100", "H100")
    dearer = _submit(tenant, other, "dearer", "H100")
    _raise_h100(fleet)  # the H100 job's hold is short: a top-up, then the other's release
    intruder = Intruder(tenant, tenant.project)
    release = writer._release_excess_many

    def submit_then_release(*args: Any) -> int:
        intruder.start_and_wait()  # the top-up has locked the org's buckets
        return release(*args)

    monkeypatch.setattr(writer, "_release_excess_many", submit_then_release)
    run_scheduling_pass.__wrapped__(trigger="race")

    intruder.join()
    assert intruder.blocked and intruder.errors == [] and intruder.job is not None
    placed = dict(JobAttempt.objects.values_list("job_id", "gpu_type__name"))
    assert placed == {cheaper.pk: "A100", dearer.pk: "H100"}
    cheaper.current_hold.refresh_from_db()
    assert cheaper.current_hold.remaining < cheaper.current_hold.authorized  # the excess was released
    assert verify_ledger() == []


def test_an_excess_release_after_a_top_up_takes_the_buckets_in_order_with_a_cancel(
    fleet: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    tenant = make_tenant()  # no budget: only bucket locks
    Node.objects.create(name="a100-1", region=fleet["region"], gpu_type=fleet["a100"], gpu_count=8,
                        state=NodeState.READY, last_heartbeat_at=db_now(), ib_group="ib1")
    soon = fund(tenant.org, 3 * H100_PRICE // 2, expires_at=db_now() + timedelta(days=30))  # spent first
    fund(tenant.org, 10**12)
    cheaper = _submit(tenant, tenant.project, "cheaper", "A100", "H100")  # all from `soon`
    spanning = _submit(tenant, tenant.project, "spanning", "H100")  # the rest of `soon`, then the other
    hold_job(job=spanning, actor=tenant.user)  # not placed: the intruder cancels it
    dearer = _submit(tenant, tenant.project, "dearer", "H100")
    soon.refresh_from_db()
    assert soon.available == 0  # so the top-up does not lock it; the excess release does
    _raise_h100(fleet)
    intruder = Intruder(tenant, tenant.project, lambda: cancel_job(job=spanning, actor=tenant.user))
    release = writer._release_excess_many

    def cancel_then_release(*args: Any) -> int:
        intruder.start_and_wait()  # the top-up has locked the buckets with credits available
        return release(*args)

    monkeypatch.setattr(writer, "_release_excess_many", cancel_then_release)
    run_scheduling_pass.__wrapped__(trigger="race")

    intruder.join()
    assert intruder.blocked and intruder.errors == []
    assert Job.objects.get(pk=spanning.pk).state == JobState.CANCELLED
    placed = dict(JobAttempt.objects.values_list("job_id", "gpu_type__name"))
    assert placed == {cheaper.pk: "A100", dearer.pk: "H100"}
    assert verify_ledger() == []


def test_a_bucket_refilled_after_the_lock_ahead_does_not_deadlock_the_top_up(
    fleet: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    tenant = make_tenant()  # no budget
    low = fund(tenant.org, H100_PRICE, expires_at=db_now() + timedelta(days=30))  # spent first
    fund(tenant.org, 10**12)  # the higher id
    spanning = _submit(tenant, tenant.project, "spanning", "H100")  # all of `low`
    hold_job(job=spanning, actor=tenant.user)  # not placed: cancelled during the pass
    dearer = _submit(tenant, tenant.project, "dearer", "H100")  # from the higher bucket
    low.refresh_from_db()
    assert low.available == 0  # empty when the pass locks ahead
    _raise_h100(fleet)  # the dearer job's hold is short: a top-up
    cancel_errors: list[BaseException] = []
    cancelled = threading.Event()

    def cancel() -> None:
        try:
            cancel_job(job=Job.objects.get(pk=spanning.pk), actor=tenant.user)
        except BaseException as error:  # reported below
            cancel_errors.append(error)
        finally:
            cancelled.set()
            connection.close()

    intruders: list[Intruder] = []
    cancellers: list[threading.Thread] = []
    cancel_waited: list[bool] = []
    top_up = repricing._top_up

    def refill_then_submit_then_top_up(place: Any, *args: Any) -> str:
        if not intruders:  # lock_ledger_ahead has run
            cancellers.append(threading.Thread(target=cancel))
            cancellers[0].start()
            # Had the pass not locked `low`, the cancel commits now and refills it, and the
            # submission locks it and waits for the higher bucket; as it is, the cancel waits.
            cancel_waited.append(another_session_waits(cancelled))
            intruders.append(Intruder(tenant, tenant.project))
            intruders[0].start_and_wait()
        return top_up(place, *args)

    monkeypatch.setattr(repricing, "_top_up", refill_then_submit_then_top_up)
    pass_errors: list[BaseException] = []
    try:
        run_scheduling_pass.__wrapped__(trigger="race")  # no retry: a deadlock fails the test
    except BaseException as error:
        pass_errors.append(error)
    (intruder,) = intruders
    intruder.join()
    cancellers[0].join(30)
    assert cancel_errors == []
    assert cancel_waited == [True]  # the cancel waited for the pass's lock on `low`
    assert Job.objects.get(pk=spanning.pk).state == JobState.CANCELLED
    assert intruder.blocked
    assert pass_errors == [] and intruder.errors == [], (pass_errors, intruder.errors)
    assert Job.objects.get(pk=dearer.pk).state == JobState.SCHEDULED
