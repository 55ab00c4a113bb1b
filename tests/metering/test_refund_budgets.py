"""A refund gives the budgets their room back, and keeps giving it when a period is counted again
(budgets/refunds.py). Session 16 left budgets as if refunded money was still spent; session 17's
first try lost the credit at a recount, gave a budget set after the run nothing back, and
under-credited an attempt refund after a job refund."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.db import transaction
from django.utils import timezone
from hypothesis import given
from hypothesis import strategies as st

from audit.models import AuditEvent
from budgets.errors import BudgetExceeded
from budgets.models import BudgetCharge, BudgetPeriod, RefundedCapture
from budgets.periods import period_bounds
from budgets.refunds import take_newest
from budgets.services import _seed_current_period, record_capture, record_release, reserve_budgets, set_budget
from config.clock import db_now
from ledger.clock import shifted
from ledger.models import MICRO
from ledger.services import capture, place_hold, release_hold
from ledger.verification import verify_ledger
from scheduling.models import AttemptState, JobAttempt
from scheduling.services.refunds import refund_job
from tests.factories import UserFactory
from tests.metering.conftest import H100_RATE, World


def _finance() -> Any:
    user = UserFactory()
    user.groups.add(Group.objects.get_or_create(name="finance")[0])
    return user


def _used(budget: Any) -> tuple[int, int]:
    period = BudgetPeriod.objects.get(budget=budget)
    return period.held, period.spent


def _charges_add_up() -> None:
    for period in BudgetPeriod.objects.all():
        charges = BudgetCharge.objects.filter(period=period)
        assert (period.held, period.spent) == (sum(c.held for c in charges), sum(c.spent for c in charges))


def _spend(hold: Any, amount: int, key: str) -> None:
    """Capture as metering does: the ledger and the budgets that count the hold."""
    record_capture(hold=hold, amount=amount)
    capture(hold=hold, amount=amount, key=key)


def _reserve(world: World, hold: Any, amount: int) -> None:
    """Count the hold in the budgets, as a submission does."""
    reserve_budgets(hold=hold, org=world.org, project=world.project, user=world.user, amount=amount)


def _second_attempt(first: JobAttempt, world: World, amount: int) -> JobAttempt:
    JobAttempt.objects.filter(pk=first.pk).update(state=AttemptState.ENDED, ended_at=timezone.now())
    hold = place_hold(org=world.org, amount=amount, key=f"job-{first.job_id}-2", project=world.project,
                      user=world.user, gpu_types=["H100"], reference=f"job:{first.job_id}:2")
    return JobAttempt.objects.create(job_id=first.job_id, number=2, org_id=world.org.pk,
                                     state=AttemptState.RUNNING, gpu_type=world.h100, gpu_count=2,
                                     rate_per_gpu_hour=H100_RATE, hold=hold, scheduled_at=timezone.now())


@pytest.mark.django_db
def test_a_refund_gives_a_hard_budget_its_room_back(make_attempt, funded, world: World) -> None:
    """A member whose hard budget a failed run used up could submit again once finance refunded it."""
    funded(100 * MICRO)
    member, _ = set_budget(org=world.org, project=world.project, user=world.user, period="month",
                           limit=10 * MICRO, enforcement="hard")
    org_budget, _ = set_budget(org=world.org, period="month", limit=50 * MICRO, enforcement="hard")
    attempt = make_attempt(hold_amount=10 * MICRO)
    _reserve(world, attempt.hold, 10 * MICRO)
    _spend(attempt.hold, 8 * MICRO, "run")
    release_hold(hold=attempt.hold, key="end")
    record_release(hold=attempt.hold, amount=2 * MICRO)
    assert _used(member) == (0, 8 * MICRO)

    def reserve(key: str) -> None:
        hold = place_hold(org=world.org, amount=5 * MICRO, key=key, project=world.project, user=world.user)
        with transaction.atomic():
            _reserve(world, hold, 5 * MICRO)

    with pytest.raises(BudgetExceeded):
        reserve("before")
    finance = _finance()
    refund_job(job_id=attempt.job_id, amount=6 * MICRO, reason="bad node", key="r1", actor=finance)
    assert _used(member) == _used(org_budget) == (0, 2 * MICRO)
    credited = AuditEvent.objects.filter(action="budget.refund_credited")
    assert sorted((e.subject_id, e.amount) for e in credited) == sorted(
        [(str(member.pk), 6 * MICRO), (str(org_budget.pk), 6 * MICRO)])
    assert credited.first().data["reference"] == f"refund:job:{attempt.job_id}:r1"
    reserve("after")  # 2 spent + 5 held fits the 10 now
    # A replay credits nothing twice.
    assert refund_job(job_id=attempt.job_id, amount=6 * MICRO, reason="bad node", key="r1",
                      actor=finance).replayed
    assert _used(member) == (5 * MICRO, 2 * MICRO)
    _charges_add_up()
    assert verify_ledger() == []


@pytest.mark.django_db
def test_a_recount_of_the_period_keeps_the_credit(make_attempt, funded, world: World) -> None:
    """Review: redefining the budget (or a window opening) recounted spent from the captures and
    the refund's credit was lost."""
    funded(100 * MICRO)
    budget, _ = set_budget(org=world.org, period="month", limit=50 * MICRO, enforcement="hard")
    attempt = make_attempt(hold_amount=10 * MICRO)
    _reserve(world, attempt.hold, 10 * MICRO)
    _spend(attempt.hold, 4 * MICRO, "run")
    refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node", key="r1")
    assert _used(budget)[1] == MICRO
    now = timezone.now()
    set_budget(org=world.org, period="window", window_start=now - timedelta(days=1),
               window_end=now + timedelta(days=1), limit=50 * MICRO, enforcement="hard")
    window = BudgetPeriod.objects.get(budget=budget, starts_at=now - timedelta(days=1))
    assert window.spent == MICRO  # 4 captured, 3 refunded
    _charges_add_up()
    refund_job(job_id=attempt.job_id, amount=MICRO, reason="rest", key="r2")
    window.refresh_from_db()
    assert window.spent == 0
    set_budget(org=world.org, period="month", limit=50 * MICRO, enforcement="hard")  # counted afresh
    month = BudgetPeriod.objects.exclude(pk=window.pk).get(budget=budget)
    assert month.spent == 0
    _charges_add_up()


@pytest.mark.django_db
def test_a_budget_set_after_the_run_gets_its_room_back(make_attempt, funded, world: World) -> None:
    """Review: a budget seeded after the capture had no charge of the hold with its spend, so the
    refund found nothing to credit."""
    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=10 * MICRO)
    capture(hold=attempt.hold, amount=4 * MICRO, key="run")  # no budget counts it yet
    release_hold(hold=attempt.hold, key="end")
    budget, _ = set_budget(org=world.org, project=world.project, period="month", limit=20 * MICRO,
                           enforcement="hard")
    assert _used(budget) == (0, 4 * MICRO)
    refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node", key="r1")
    assert _used(budget) == (0, MICRO)
    _charges_add_up()


@pytest.mark.django_db
def test_a_job_refund_then_an_attempt_refund_credit_in_full(make_attempt, funded, world: World) -> None:
    """Review: the job refund took the newest attempt's charges, and a refund of that attempt then
    found less than its amount to credit. It takes the job's other attempts' instead."""
    funded(100 * MICRO)
    budget, _ = set_budget(org=world.org, period="month", limit=50 * MICRO, enforcement="hard")
    first = make_attempt(hold_amount=10 * MICRO)
    _reserve(world, first.hold, 10 * MICRO)
    _spend(first.hold, 4 * MICRO, "run1")
    second = _second_attempt(first, world, 10 * MICRO)
    _reserve(world, second.hold, 10 * MICRO)
    _spend(second.hold, 4 * MICRO, "run2")
    assert _used(budget)[1] == 8 * MICRO
    refund_job(job_id=first.job_id, amount=3 * MICRO, reason="job", key="r1")
    refund_job(job_id=first.job_id, amount=2 * MICRO, reason="attempt 1", key="r2", attempt_number=1)
    refund_job(job_id=first.job_id, amount=2 * MICRO, reason="attempt 2", key="r3", attempt_number=2)
    assert _used(budget)[1] == MICRO
    given_back = {(r.reference.rsplit(":", 1)[1], r.hold_id, r.amount) for r in RefundedCapture.objects.all()}
    assert given_back == {("r1", second.hold_id, 3 * MICRO),  # the newest attempt's
                          ("r2", first.hold_id, 2 * MICRO),  # its own attempt's first
                          ("r3", second.hold_id, MICRO),  # what r1 left of attempt 2, then attempt 1
                          ("r3", first.hold_id, MICRO)}
    _charges_add_up()


@pytest.mark.django_db
def test_only_the_refunded_captures_inside_a_window_leave_it(make_attempt, funded, world: World) -> None:
    """A window counts the captures made in it: a refund of captures made before it gives it
    nothing, now or at a recount."""
    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=10 * MICRO)
    with shifted(timedelta(hours=-3)):
        capture(hold=attempt.hold, amount=4 * MICRO, key="early")  # before the window
    capture(hold=attempt.hold, amount=3 * MICRO, key="late")
    now = timezone.now()
    budget, _ = set_budget(org=world.org, period="window", window_start=now - timedelta(hours=1),
                           window_end=now + timedelta(hours=1), limit=50 * MICRO, enforcement="hard")
    assert _used(budget) == (3 * MICRO, 3 * MICRO)
    refund_job(job_id=attempt.job_id, amount=2 * MICRO, reason="a", key="r1")  # 2 of "late"
    assert _used(budget)[1] == MICRO
    refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="b", key="r2")  # 1 of "late", 2 of "early"
    assert _used(budget)[1] == 0
    set_budget(org=world.org, period="window", window_start=now - timedelta(hours=2),
               window_end=now + timedelta(hours=1), limit=50 * MICRO, enforcement="hard")
    recounted = BudgetPeriod.objects.get(budget=budget, starts_at=now - timedelta(hours=2))
    assert recounted.spent == 0  # "early" is still outside this window: its refund takes nothing here
    set_budget(org=world.org, period="window", window_start=now - timedelta(hours=4),
               window_end=now + timedelta(hours=1), limit=50 * MICRO, enforcement="hard")
    wide = BudgetPeriod.objects.get(budget=budget, starts_at=now - timedelta(hours=4))
    assert wide.spent == 2 * MICRO  # 7 captured, 5 refunded
    _charges_add_up()


@given(captures=st.lists(st.integers(0, 20), max_size=8), refunds=st.lists(st.integers(1, 30), max_size=6))
def test_take_newest_gives_back_the_newest_captures_first(captures: list[int], refunds: list[int]) -> None:
    left = dict(enumerate(captures, start=1))  # capture id -> not refunded yet
    for amount in refunds:
        taken = take_newest(left.items(), amount)
        assert sum(part for _, part in taken) == min(amount, sum(left.values()))
        for capture_id, part in taken:
            assert 0 < part <= left[capture_id]
            left[capture_id] -= part
        if taken:  # nothing newer than what it took is left unrefunded
            oldest = min(capture_id for capture_id, _ in taken)
            assert all(left[c] == 0 for c in left if c > oldest)


def _live(budget: Any) -> BudgetPeriod:
    """The period in force now, by the budget's bounds (not just any row of it)."""
    budget.refresh_from_db()
    starts, _ = period_bounds(period=budget.period, window_start=budget.window_start,
                              window_end=budget.window_end, now=db_now())
    return BudgetPeriod.objects.get(budget=budget, starts_at=starts)


def _recount(budget: Any) -> int:
    with transaction.atomic():
        return _seed_current_period(budget, now=db_now()).spent


@pytest.mark.django_db
@pytest.mark.parametrize("first", ["window-inside-the-month", "month-then-earlier-window"])
def test_a_refund_after_a_redefinition_credits_the_period_in_force(make_attempt, funded, world: World,
                                                                    first: str) -> None:
    """Review: the credit went to the period that starts latest, which after a redefinition may be
    the old one (a window inside the month, then the month; a month, then a window from before
    the 1st): the budget in force stayed used up, and a recount disagreed. The hold's newest
    charge (the period it was last counted in) is credited first."""
    funded(100 * MICRO)
    now = timezone.now()
    window = {"period": "window", "window_start": now - timedelta(minutes=10),
              "window_end": now + timedelta(hours=1)}
    if first == "month-then-earlier-window":
        window["window_start"] = now.replace(day=1, hour=0, minute=0) - timedelta(days=1)
    month = {"period": "month"}
    before, after = (window, month) if first.startswith("window") else (month, window)
    budget, _ = set_budget(org=world.org, project=world.project, user=world.user, limit=10 * MICRO,
                           enforcement="hard", **before)
    attempt = make_attempt(hold_amount=10 * MICRO)
    _reserve(world, attempt.hold, 10 * MICRO)
    _spend(attempt.hold, 8 * MICRO, "run")
    release_hold(hold=attempt.hold, key="end")
    record_release(hold=attempt.hold, amount=2 * MICRO)
    set_budget(org=world.org, project=world.project, user=world.user, limit=10 * MICRO, enforcement="hard",
               **after)
    assert _live(budget).spent == 8 * MICRO
    refund_job(job_id=attempt.job_id, amount=6 * MICRO, reason="bad node", key="r1")
    assert _live(budget).spent == 2 * MICRO == _recount(budget)
    hold = place_hold(org=world.org, amount=5 * MICRO, key="next", project=world.project, user=world.user)
    with transaction.atomic():
        _reserve(world, hold, 5 * MICRO)  # 2 spent + 5 fits the 10 again
    _charges_add_up()


@pytest.mark.django_db
def test_a_capture_committed_late_does_not_move_the_refund(make_attempt, funded, world: World) -> None:
    """Review: refunds were laid on positions in the captures sorted by time, and a capture whose
    transaction began before an earlier-committed one (its `created_at` is its start) shifted
    them. They are laid on the captures themselves now."""
    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=20 * MICRO)
    with shifted(timedelta(hours=-3)):
        capture(hold=attempt.hold, amount=4 * MICRO, key="old")
    capture(hold=attempt.hold, amount=3 * MICRO, key="a")
    refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node", key="r1")  # "a"
    with shifted(timedelta(seconds=-2)):  # began before "a", committed after the refund
        capture(hold=attempt.hold, amount=2 * MICRO, key="b")
    now = timezone.now()
    budget, _ = set_budget(org=world.org, period="window", window_start=now - timedelta(seconds=1),
                           window_end=now + timedelta(hours=1), limit=50 * MICRO, enforcement="hard")
    assert _used(budget)[1] == 0  # "a" alone is in the window, and it was refunded


@pytest.mark.django_db
def test_periods_counted_before_the_change_get_their_spending_charges(make_attempt, funded,
                                                                      world: World) -> None:
    """Review: a period recounted before 0005 had no charge of the holds that only spent, so a
    refund credited it nothing; migration 0007 gives it those charges."""
    import importlib

    from django.apps import apps

    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=10 * MICRO)
    capture(hold=attempt.hold, amount=4 * MICRO, key="run")
    release_hold(hold=attempt.hold, key="end")
    budget, _ = set_budget(org=world.org, period="month", limit=20 * MICRO, enforcement="hard")
    BudgetCharge.objects.filter(held=0).delete()  # what the recount wrote before 0005
    migration = importlib.import_module("budgets.migrations.0007_spent_charges_of_seeded_periods")
    migration.forwards(apps, None)
    _charges_add_up()
    refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node", key="r1")
    assert _used(budget)[1] == MICRO == _recount(budget)


@pytest.mark.django_db
def test_after_migration_0007_the_period_in_force_is_credited_first(make_attempt, funded,
                                                                      world: World) -> None:
    """Review: window -> month -> the same window leaves the window's older row in force, and the
    migration gave the month's row the newer charge: the refund credited the month. The period in
    force is credited first, whatever the charges' order."""
    import importlib

    from django.apps import apps

    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=10 * MICRO)
    capture(hold=attempt.hold, amount=4 * MICRO, key="run")
    release_hold(hold=attempt.hold, key="end")
    now = timezone.now()
    window = {"period": "window", "window_start": now - timedelta(minutes=30),
              "window_end": now + timedelta(hours=1)}
    budget, _ = set_budget(org=world.org, limit=20 * MICRO, enforcement="hard", **window)
    set_budget(org=world.org, period="month", limit=20 * MICRO, enforcement="hard")
    set_budget(org=world.org, limit=20 * MICRO, enforcement="hard", **window)
    in_force = BudgetPeriod.objects.get(budget=budget, starts_at=window["window_start"])
    BudgetCharge.objects.filter(held=0).delete()  # as recounted before 0005
    importlib.import_module("budgets.migrations.0007_spent_charges_of_seeded_periods").forwards(apps, None)
    _charges_add_up()
    refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="bad node", key="r1")
    in_force.refresh_from_db()
    assert in_force.spent == MICRO == _recount(budget)
