"""Review of 94e0710 (settlement extends the hold by the run's overrun, `settlement._fund_overrun`):
the locks it took out of order, now taken ahead (`charging.lock_ahead_for_extension`).

The extension runs *before* the settlement's budget moves: hold -> usage -> `record_extension`
(the CURRENT budget periods) -> `extend_hold` (the org's eligible buckets, then the audit chain
head) -> `record_capture` / `record_release` (the periods the hold COUNTS IN) -> `settle_hold`.
When the hold counts in a period that is no longer current (a hold placed last month, a window
that has ended: any run spanning a month boundary), that period is locked after buckets and the
audit head, against DESIGN.md §6 (budgets before buckets) and against every other settlement,
capture or requeue of the org's last-month holds, which lock that period and then buckets.
Likewise `extend_hold` locks the org's buckets with credits available, then `settle_hold` the
hold's own lines' buckets, a drawn-dry or expired one with a lower id among them (ascending id
broken); and a crossed soft budget's alert locks the audit chain head before the buckets.
`lifecycle.lock_ledger_for_requeue` takes the locks ahead only for a requeue; a permanent end
(completed, failed, timed out, cancelled, out of credit, retries exhausted) and the stranded-hold
sweep take none.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from audit.models import AuditChainHead
from ledger.models import MICRO, HoldState
from metering.heartbeats import HeartbeatItem
from metering.services import ingest_heartbeats, settle_attempt
from scheduling.models import AttemptState, JobAttempt
from tests.metering.conftest import World
from tests.metering.test_requeue_lock_order import _wait_for
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def hold_the_org_audit_head(org_id: int) -> tuple[Worker, threading.Event]:
    """A writer of the org's audit chain that holds its head until the event is set (started, and
    holding it, on return)."""
    chain = f"org:{org_id}"
    AuditChainHead.objects.get_or_create(chain=chain, defaults={"seq": 0, "hash": "0" * 64})
    locked, release = threading.Event(), threading.Event()

    def any_audit_writer_of_the_org() -> None:
        with transaction.atomic():
            AuditChainHead.objects.select_for_update().get(chain=chain)
            locked.set()
            release.wait(30)

    blocker = Worker(any_audit_writer_of_the_org).start()
    assert locked.wait(10)
    return blocker, release


def _roll_the_month_over(org_id: int) -> None:
    """What the database looks like on the 1st: the org's periods (and the holds' charges in them)
    are last month's; the current month has no period row yet (the first writer creates it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE budgets_budgetperiod SET ends_at = starts_at, starts_at = starts_at - interval '40 days' "
            "WHERE org_id = %s", [org_id])


def test_a_permanent_end_with_an_overrun_after_a_month_boundary_does_not_deadlock(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    from budgets.services import set_budget

    funded(100 * MICRO)
    overran = make_attempt(hold_amount=1 * MICRO, gpus=(0, 1))
    other = make_attempt(hold_amount=1 * MICRO, gpus=(2, 3))
    set_budget(org=world.org, period="month", limit=1_000 * MICRO, enforcement="hard")  # counts both
    _roll_the_month_over(world.org.pk)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(overran.pk, 1, 5_000_000),  # 5 credits
                                              HeartbeatItem(other.pk, 1, 500_000)])  # within its hold
    JobAttempt.objects.filter(pk__in=[overran.pk, other.pk]).update(state=AttemptState.ENDED)


    def settle(a: JobAttempt) -> Callable[[], Any]:
        def work() -> Any:
            with transaction.atomic():  # no retry: show the conflict
                return settle_attempt(attempt=a, outcome="completed")
        return work

    blocker, release = hold_the_org_audit_head(world.org.pk)
    first = Worker(settle(overran)).start()  # extends: new period, the buckets; waits for the head
    assert _wait_for(1)
    second = Worker(settle(other)).start()  # last month's period, then waits for the bucket
    assert _wait_for(2)
    release.set()
    for w in (blocker, first, second):
        w.join()
    errors = [repr(e) for w in (first, second) for e in w.errors]
    assert errors == [], errors
    overran.hold.refresh_from_db()
    assert overran.hold.state == HoldState.SETTLED and overran.hold.captured == 5 * MICRO


def test_a_soft_budget_alert_of_the_overrun_does_not_lock_the_audit_head_before_the_buckets(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """`record_extension` writes a crossed soft budget's alert (`budget.soft_limit_exceeded`) as
    soon as it has counted the extension, i.e. it locks the org's audit chain head BEFORE
    `extend_hold` locks the buckets ("the audit chain head is always locked last", docs/ledger.md).
    At settlement (no locks ahead on a permanent end) that deadlocks with any writer of the org that
    locks a bucket and then the head without passing through that budget's period: here a hold
    placed for the org at large (the soft budget is the project's)."""
    from budgets.services import set_budget
    from ledger.services import place_hold

    funded(100 * MICRO)
    overran = make_attempt(hold_amount=1 * MICRO)
    set_budget(org=world.org, project=world.project, period="month", limit=1 * MICRO, enforcement="soft")
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(overran.pk, 1, 5_000_000)])  # 5 credits
    JobAttempt.objects.filter(pk=overran.pk).update(state=AttemptState.ENDED)


    def settle() -> Any:
        with transaction.atomic():  # no retry: show the conflict
            return settle_attempt(attempt=overran, outcome="completed")

    def org_hold() -> Any:
        with transaction.atomic():
            return place_hold(org=world.org, amount=1 * MICRO, key="org-wide", reference="racer")

    blocker, release = hold_the_org_audit_head(world.org.pk)
    first = Worker(settle).start()  # the project's period, then the soft alert waits for the head
    assert _wait_for(1)
    second = Worker(org_hold).start()  # locks the org's bucket, then waits for the head
    assert _wait_for(2)
    release.set()
    for w in (blocker, first, second):
        w.join()
    errors = [repr(e) for w in (first, second) for e in w.errors]
    assert errors == [], errors


@pytest.mark.parametrize("path", ["settle", "finish_attempt", "stranded-sweep"])
def test_an_overrun_funded_from_a_higher_bucket_does_not_lock_the_holds_own_lower_bucket_after_it(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt], path: str
) -> None:
    """No budget at all. `extend_hold` locks the org's eligible buckets (those with credits
    available), then `settle_hold` locks the hold's own lines' buckets: a bucket the hold drew dry
    (or that has expired) is not eligible, so when its id is lower it is locked after a higher
    one, against "buckets by ascending id". Any settlement, capture or release of another hold
    with lines on both buckets (taken in id order) then deadlocks with it. Here the org's first
    grant B1 is all on two holds, the second B2 funds the overrun. The same through the
    stranded-hold sweep (`_settle_stranded`, which locks only the hold)."""
    funded(2 * MICRO)  # B1: spent first (lower id, same kind)
    funded(100 * MICRO)  # B2
    overran = make_attempt(hold_amount=1 * MICRO, gpus=(0, 1))  # all on B1
    other = make_attempt(hold_amount=2 * MICRO, gpus=(2, 3))  # the rest of B1, then B2
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(overran.pk, 1, 5_000_000),
                                              HeartbeatItem(other.pk, 1, 500_000)])
    ending = [other] if path == "finish_attempt" else [overran, other]
    JobAttempt.objects.filter(pk__in=[a.pk for a in ending]).update(state=AttemptState.ENDED)


    def settle(a: JobAttempt) -> Callable[[], Any]:
        def work() -> Any:
            with transaction.atomic():  # no retry: show the conflict
                if path == "finish_attempt" and a.pk == overran.pk:  # the job completed: no requeue
                    from scheduling.services.lifecycle import finish_attempt

                    return finish_attempt(attempt=a, outcome="completed", exit_code=0)
                return settle_attempt(attempt=a, outcome="completed")
        return work

    blocker, release = hold_the_org_audit_head(world.org.pk)
    if path == "stranded-sweep":
        from metering.sweeps import _settle_stranded
        from scheduling.models import Job, JobState

        Job.objects.filter(pk=overran.job_id).update(state=JobState.COMPLETED)

        def sweep() -> Any:
            with transaction.atomic():  # no retry: show the conflict
                return _settle_stranded(overran.hold_id)
        first = Worker(sweep).start()
    else:
        first = Worker(settle(overran)).start()  # the extension locks B2, waits for the head
    assert _wait_for(1)
    second = Worker(settle(other)).start()  # B1, then waits for B2
    assert _wait_for(2)
    release.set()
    for w in (blocker, first, second):
        w.join()
    errors = [repr(e) for w in (first, second) for e in w.errors]
    assert errors == [], errors
