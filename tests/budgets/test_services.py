"""Budget periods, hard/soft checks, and held -> spent / released bookkeeping per hold."""

from datetime import UTC, datetime

import pytest
from django.db import transaction

from budgets.errors import BudgetExceeded
from budgets.models import BudgetCharge, BudgetPeriod
from budgets.periods import month_bounds, period_bounds
from budgets.services import (
    record_capture,
    record_release,
    record_release_many,
    reserve_budgets,
    set_budget,
)
from ledger.services import place_hold
from tests.api.factories import make_tenant

pytestmark = pytest.mark.django_db


def test_month_bounds_wrap_the_year() -> None:
    assert month_bounds(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == (
        datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    window = (datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC))
    assert period_bounds(period="window", window_start=window[0], window_end=window[1],
                         now=datetime(2026, 1, 2, tzinfo=UTC)) is None


def test_reserve_capture_release_move_held_to_spent() -> None:
    tenant = make_tenant(funds=1000)
    set_budget(org=tenant.org, period="month", limit=500, enforcement="hard")
    set_budget(org=tenant.org, project=tenant.project, user=tenant.user, period="month", limit=300,
               enforcement="hard")
    hold = place_hold(org=tenant.org, amount=200, key="h1", project=tenant.project, user=tenant.user)
    charges = reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=200)
    assert len(charges) == 2
    assert reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user,
                           amount=200) == charges  # idempotent per hold
    record_capture(hold=hold, amount=50)
    record_release(hold=hold, amount=150)
    assert {(p.held, p.spent) for p in BudgetPeriod.objects.all()} == {(0, 50)}
    assert {(c.held, c.spent) for c in BudgetCharge.objects.all()} == {(0, 50)}
    second = place_hold(org=tenant.org, amount=260, key="h2", project=tenant.project, user=tenant.user)
    with pytest.raises(BudgetExceeded) as error:
        reserve_budgets(hold=second, org=tenant.org, project=tenant.project, user=tenant.user, amount=260)
    assert error.value.level == "member" and error.value.used == 50
    assert "0.00005 are used or held and 0.00026 more were requested" in error.value.detail  # credits


def test_record_release_many_matches_per_hold_releases() -> None:
    tenant = make_tenant(funds=2000)
    set_budget(org=tenant.org, period="month", limit=1500, enforcement="hard")
    set_budget(org=tenant.org, project=tenant.project, period="month", limit=1500, enforcement="hard")
    holds = []
    for key, amount in (("a", 300), ("b", 200), ("c", 100)):
        hold = place_hold(org=tenant.org, amount=amount, key=key, project=tenant.project, user=tenant.user)
        reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=amount)
        holds.append(hold)
    record_capture(hold=holds[2], amount=60)
    # 120 of a, all of b, and more than c still holds (clamped to its 40 held).
    record_release_many(items=[(holds[0], 120), (holds[1], 200), (holds[2], 90)])
    assert {(p.held, p.spent) for p in BudgetPeriod.objects.all()} == {(180, 60)}
    held = {c.hold_id: c.held for c in BudgetCharge.objects.all()}
    assert held == {holds[0].pk: 180, holds[1].pk: 0, holds[2].pk: 0}
    record_release_many(items=[])  # nothing to do
    with pytest.raises(ValueError):
        record_release_many(items=[(holds[0], 1), (holds[0], 2)])


def test_a_hold_extended_into_a_new_period_counts_each_capture_once() -> None:
    """Review: a hold reserved last month and extended this month has a charge in both periods of
    the budget; every capture and release was counted in both (spent twice, held dropped twice)."""
    from datetime import timedelta

    from budgets.services import record_extension

    tenant = make_tenant(funds=10_000)
    budget, _ = set_budget(org=tenant.org, period="month", limit=5000, enforcement="hard")
    hold = place_hold(org=tenant.org, amount=400, key="long", project=tenant.project, user=tenant.user)
    reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=400)
    # That reservation was made last month.
    earlier = BudgetPeriod.objects.get(budget=budget)
    earlier.starts_at, earlier.ends_at = earlier.starts_at - timedelta(days=40), earlier.starts_at
    earlier.save()
    record_extension(hold=hold, amount=100)  # this month
    current = BudgetPeriod.objects.exclude(pk=earlier.pk).get(budget=budget)

    def counts() -> tuple[tuple[int, int], tuple[int, int]]:
        earlier.refresh_from_db()
        current.refresh_from_db()
        return (earlier.held, earlier.spent), (current.held, current.spent)

    assert counts() == ((400, 0), (100, 0))
    record_capture(hold=hold, amount=150)  # spent this month, once; held goes latest period first
    assert counts() == ((350, 0), (0, 150))
    record_release(hold=hold, amount=50)
    assert counts() == ((300, 0), (0, 150))
    record_release_many(items=[(hold, 300)])
    assert counts() == ((0, 0), (0, 150))
    assert sum(c.spent for c in BudgetCharge.objects.filter(hold=hold)) == 150


def test_a_budget_set_mid_period_starts_from_what_its_scope_already_did() -> None:
    """QA (session 10): a month budget set on the 22nd counted nothing of the month so far, and
    holds placed before it counted only the part captured after it."""
    from ledger.services import capture

    tenant = make_tenant(funds=10_000)
    other = make_tenant(funds=10_000)  # another org: never counted
    kept = place_hold(org=tenant.org, amount=400, key="kept", project=tenant.project, user=tenant.user)
    capture(hold=kept, amount=150, key="c1")
    done = place_hold(org=tenant.org, amount=300, key="done", project=tenant.project, user=tenant.user)
    capture(hold=done, amount=300, key="c2")
    place_hold(org=other.org, amount=900, key="theirs", project=other.project, user=other.user)

    budget, _ = set_budget(org=tenant.org, period="month", limit=1000, enforcement="hard")
    period = BudgetPeriod.objects.get(budget=budget)
    assert (period.held, period.spent) == (250, 450)  # kept's 250 still held; 150 + 300 captured
    # One charge per hold it counted: kept's held and captured, done's captured.
    assert sorted(BudgetCharge.objects.values_list("hold_id", "held", "spent")) == [
        (kept.pk, 250, 150), (done.pk, 0, 300)]

    # The hold placed before the budget now moves it like any other: capture, then release.
    record_capture(hold=kept, amount=100)
    record_release(hold=kept, amount=150)
    period.refresh_from_db()
    assert (period.held, period.spent) == (0, 550)
    # A hard limit sees the month so far: 550 used, so 500 more does not fit.
    late = place_hold(org=tenant.org, amount=500, key="late", project=tenant.project, user=tenant.user)
    with pytest.raises(BudgetExceeded) as error, transaction.atomic():  # as the submission's own
        reserve_budgets(hold=late, org=tenant.org, project=tenant.project, user=tenant.user, amount=500)
    assert error.value.used == 550
    # Replacing the limit keeps the period's counts (no second seeding).
    set_budget(org=tenant.org, period="month", limit=2000, enforcement="hard")
    period.refresh_from_db()
    assert (period.held, period.spent) == (0, 550)


def test_going_back_to_an_earlier_window_counts_it_afresh() -> None:
    """QA: window -> month -> the same window again reused the window's old row, which had missed
    what was captured meanwhile under the month budget."""
    from datetime import timedelta

    from django.utils import timezone

    from ledger.services import capture

    tenant = make_tenant(funds=10_000)
    window = {"period": "window", "window_start": timezone.now() - timedelta(days=1),
              "window_end": timezone.now() + timedelta(days=1)}
    budget, _ = set_budget(org=tenant.org, limit=5000, enforcement="hard", **window)
    set_budget(org=tenant.org, period="month", limit=5000, enforcement="hard")
    hold = place_hold(org=tenant.org, amount=300, key="meanwhile", project=tenant.project, user=tenant.user)
    reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=300)
    capture(hold=hold, amount=120, key="c")
    record_capture(hold=hold, amount=120)
    set_budget(org=tenant.org, limit=5000, enforcement="hard", **window)
    period = BudgetPeriod.objects.get(budget=budget, starts_at=window["window_start"])
    assert (period.held, period.spent) == (180, 120)
    assert list(BudgetCharge.objects.filter(period=period).values_list("hold_id", "held")) == [(hold.pk, 180)]


def test_the_embedded_path_reads_the_same_budgets_with_aware_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """QA: on SQLite the raw rows' window times came back naive and every submission under a window
    budget was a 500. The ORM path (other databases) must find the same budgets, times aware."""
    from datetime import timedelta
    from types import SimpleNamespace

    from django.utils import timezone

    from budgets import services
    from budgets.services import _applicable

    tenant = make_tenant(funds=1000)
    start = timezone.now() - timedelta(days=1)
    set_budget(org=tenant.org, period="window", window_start=start, window_end=start + timedelta(days=30),
               limit=500, enforcement="hard")
    set_budget(org=tenant.org, project=tenant.project, user=tenant.user, period="month", limit=300,
               enforcement="hard")
    prepared = _applicable(tenant.org.pk, tenant.project.pk, tenant.user.pk)
    monkeypatch.setattr(services, "connection", SimpleNamespace(vendor="sqlite"))  # the branch taken
    portable = _applicable(tenant.org.pk, tenant.project.pk, tenant.user.pk)
    assert [b.pk for b in portable] == [b.pk for b in prepared] and len(portable) == 2
    assert portable[0].window_start == start and portable[0].window_start.tzinfo is not None


def test_setting_a_budget_is_audited_with_its_limit_and_what_it_replaced() -> None:
    """QA: `budget.set` recorded the level, period and enforcement, not the limit, the window or
    the values a change replaced."""
    from audit.models import AuditEvent

    tenant = make_tenant()
    start, end = datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)
    set_budget(org=tenant.org, period="window", window_start=start, window_end=end, limit=20,
               enforcement="hard")
    set_budget(org=tenant.org, period="month", limit=500, enforcement="soft")
    first, second = AuditEvent.objects.filter(action="budget.set").order_by("pk")
    assert first.data["before"] is None and first.data["limit"] == 20
    assert first.data["window_start"] == start.isoformat()
    assert (second.data["limit"], second.data["period"], second.data["enforcement"]) == (500, "month", "soft")
    assert second.data["before"] == {"limit": 20, "period": "window", "enforcement": "hard",
                                     "window_start": start.isoformat(), "window_end": end.isoformat()}


@pytest.mark.parametrize("move", ["capture", "release", "release_many"])
def test_a_redefined_budget_moves_an_active_holds_count_to_the_current_period(move: str) -> None:
    """Review: widening a window budget (an earlier start) seeded the active hold's charge in the
    new current period and left its old one: a later capture or release took the old charge
    first (latest period by start), and the current period kept the hold's 400 held for ever."""
    from datetime import timedelta

    from config.clock import db_now

    tenant = make_tenant(funds=10_000)
    now = db_now()
    budget, _ = set_budget(org=tenant.org, period="window", window_start=now - timedelta(days=5),
                           window_end=now + timedelta(days=5), limit=1000, enforcement="hard")
    hold = place_hold(org=tenant.org, amount=400, key="h", project=tenant.project, user=tenant.user)
    reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=400)
    set_budget(org=tenant.org, period="window", window_start=now - timedelta(days=10),
               window_end=now + timedelta(days=10), limit=1000, enforcement="hard")
    old = BudgetPeriod.objects.get(budget=budget, starts_at=now - timedelta(days=5))
    current = BudgetPeriod.objects.get(budget=budget, starts_at=now - timedelta(days=10))
    assert (current.held, current.spent, old.held) == (400, 0, 0)  # moved, not copied
    if move == "capture":
        record_capture(hold=hold, amount=400)
    elif move == "release":
        record_release(hold=hold, amount=400)
    else:
        record_release_many(items=[(hold, 400)])
    current.refresh_from_db()
    old.refresh_from_db()
    assert (current.held, current.spent) == ((0, 400) if move == "capture" else (0, 0))
    assert (old.held, old.spent) == (0, 0)
    assert sum(BudgetCharge.objects.filter(hold=hold).values_list("held", flat=True)) == 0
