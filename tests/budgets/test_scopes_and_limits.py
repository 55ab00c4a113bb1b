"""Budget scopes and limits at their edges: a hard limit reached exactly, a seeding that counts only
its own scope and what a hold still holds, a member budget that is one member's, and the soft
alert an extension writes (mutation testing, session 18)."""

import pytest

from audit.models import AuditEvent
from budgets.errors import BudgetExceeded
from budgets.models import BudgetPeriod
from budgets.services import precheck_budgets, record_extension, record_release, reserve_budgets, set_budget
from ledger.services import capture, place_hold, release_hold, release_partial
from tests.api.factories import add_member, make_tenant
from tests.factories import ProjectFactory

pytestmark = pytest.mark.django_db


def _counts(budget) -> tuple[int, int]:
    period = BudgetPeriod.objects.get(budget=budget)
    return period.held, period.spent


def test_an_extension_may_fill_a_hard_budget_exactly_but_not_one_past_it() -> None:
    """Mutation testing, session 18: the hard check `used + amount <= limit` made `<` went
    unnoticed: a budget could then never be used to its last micro-credit."""
    tenant = make_tenant(funds=10_000)
    budget, _ = set_budget(org=tenant.org, period="month", limit=1000, enforcement="hard")
    hold = place_hold(org=tenant.org, amount=600, key="h", project=tenant.project, user=tenant.user)
    reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=600)
    record_extension(hold=hold, amount=400)
    assert _counts(budget) == (1000, 0)
    with pytest.raises(BudgetExceeded) as error:
        record_extension(hold=hold, amount=1)
    assert (error.value.used, error.value.limit) == (1000, 1000)
    assert _counts(budget) == (1000, 0)


def test_a_project_or_member_budget_set_mid_month_counts_only_its_own_scopes_captures() -> None:
    """Mutation testing, session 18: without `hold__in=` the seeding's spent summed every capture
    of the org, so a project (or member) budget set mid-month started charged with other
    projects' (or members') spending and could refuse its first job."""
    tenant = make_tenant(funds=10_000)
    p1, p2 = tenant.project, ProjectFactory(org=tenant.org)
    a, b = tenant.user, add_member(p1)
    elsewhere = place_hold(org=tenant.org, amount=500, key="p2", project=p2, user=a)
    capture(hold=elsewhere, amount=300, key="c-p2")
    theirs = place_hold(org=tenant.org, amount=300, key="b", project=p1, user=b)
    capture(hold=theirs, amount=200, key="c-b")

    project_budget, _ = set_budget(org=tenant.org, project=p1, period="month", limit=5000, enforcement="hard")
    assert _counts(project_budget) == (100, 200)  # b's hold in P1 only, nothing of P2
    member_budget, _ = set_budget(org=tenant.org, project=p1, user=a, period="month", limit=5000,
                                  enforcement="hard")
    assert _counts(member_budget) == (0, 0)  # a spent only in P2; b's capture in P1 is b's
    org_budget, _ = set_budget(org=tenant.org, period="month", limit=5000, enforcement="hard")
    assert _counts(org_budget) == (300, 500)  # the org counts both


def test_the_seeding_counts_as_held_only_what_a_hold_still_holds_after_a_partial_release() -> None:
    """Mutation testing, session 18: seeding `held` as authorized - captured (forgetting what was
    released) counted a partly released hold's given-back credits as held for as long as it ran,
    and for ever after it ended."""
    tenant = make_tenant(funds=10_000)
    hold = place_hold(org=tenant.org, amount=400, key="h", project=tenant.project, user=tenant.user)
    release_partial(hold=hold, amount=100, key="part")
    capture(hold=hold, amount=50, key="c")
    budget, _ = set_budget(org=tenant.org, period="month", limit=5000, enforcement="hard")
    assert _counts(budget) == (250, 50)
    record_release(hold=hold, amount=250)  # as the settlement does, with the ledger's release
    release_hold(hold=hold, key="end")
    assert _counts(budget) == (0, 50)


def test_a_members_budget_never_limits_another_member() -> None:
    """Mutation testing, session 18: `_applicable` is the Python path of every check outside the
    submission function (precheck, extensions); its member clause ignoring `user_id` made one
    member's budget apply to every member of the project: their extensions refused and counted
    against it."""
    tenant = make_tenant(funds=10_000)
    other = add_member(tenant.project)
    theirs, _ = set_budget(org=tenant.org, project=tenant.project, user=other, period="month", limit=100,
                           enforcement="hard")
    periods, alerts = precheck_budgets(org=tenant.org, project=tenant.project, user=tenant.user, amount=500)
    assert (periods, alerts) == ([], [])
    hold = place_hold(org=tenant.org, amount=500, key="h", project=tenant.project, user=tenant.user)
    reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=500)
    assert record_extension(hold=hold, amount=200) == []
    assert _counts(theirs) == (0, 0)  # seeded at setting, untouched since


def test_an_extension_past_a_soft_budget_is_audited() -> None:
    """Mutation testing, session 18: record_extension not writing the soft alert went unnoticed: a
    soft budget overrun by a long run's extensions left no trace for the org."""
    tenant = make_tenant(funds=10_000)
    budget, _ = set_budget(org=tenant.org, period="month", limit=100, enforcement="soft")
    hold = place_hold(org=tenant.org, amount=100, key="h", project=tenant.project, user=tenant.user)
    reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=100)
    assert not AuditEvent.objects.filter(action="budget.soft_limit_exceeded").exists()  # 100 fits 100
    record_extension(hold=hold, amount=50)
    alert = AuditEvent.objects.get(action="budget.soft_limit_exceeded")
    assert (alert.subject_type, alert.subject_id, alert.org_id) == ("budget", str(budget.pk), tenant.org.pk)
    assert (alert.amount, alert.reason_code) == (50, "soft_budget_exceeded")
    assert alert.data == {"level": "org", "limit": 100, "used": 100, "hold": hold.pk, "on": "extend"}
    assert _counts(budget) == (150, 0)  # soft: counted all the same
