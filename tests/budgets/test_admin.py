"""Budgets in the admin: finance sees every scope with its current period; nothing is written there.

QA: /admin/budgets/budget/ was a 404, and finance works in the admin.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from budgets.admin import HOW_TO_SET
from budgets.models import Budget
from budgets.services import record_capture, reserve_budgets, set_budget
from config.clock import db_now
from ledger.services import capture, place_hold
from tests.api.conftest import client_for
from tests.api.factories import make_tenant
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def finance(client: Client) -> Client:
    user = UserFactory(is_staff=True)
    user.groups.add(Group.objects.get(name="finance"))
    client.force_login(user)
    return client


def _column(page: str, name: str) -> list[str]:
    return re.findall(rf'<td class="field-{name}">([^<]*)</td>', page)


def test_finance_sees_each_scope_with_its_current_period(finance: Client) -> None:
    tenant = make_tenant(funds=10_000)
    now = db_now()
    set_budget(org=tenant.org, period="month", limit=5_000, enforcement="hard")
    set_budget(org=tenant.org, project=tenant.project, period="window", limit=4_000, enforcement="soft",
               window_start=now - timedelta(days=9), window_end=now - timedelta(days=2))  # over
    set_budget(org=tenant.org, project=tenant.project, user=tenant.user, period="month", limit=3_000,
               enforcement="hard")
    hold = place_hold(org=tenant.org, amount=1_000, key="h", project=tenant.project, user=tenant.user)
    reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=1_000)
    record_capture(hold=hold, amount=400)

    response = finance.get(reverse("admin:budgets_budget_changelist"))
    assert response.status_code == 200
    page = response.content.decode()
    assert HOW_TO_SET in page.replace("&#x27;", "'")
    project, member = str(tenant.project), f"{tenant.project}: {tenant.user}"
    assert _column(page, "scope") == [tenant.org.slug, project, member]  # org, project, member
    assert _column(page, "level") == ["Org", "Project", "Member"]
    assert _column(page, "limit") == ["5000", "4000", "3000"]
    assert _column(page, "enforcement") == ["Hard", "Soft", "Hard"]
    assert _column(page, "held_now") == ["600", "—", "600"]  # the window is over: no current period
    assert _column(page, "spent_now") == ["400", "—", "400"]
    assert _column(page, "remaining_now") == ["4000", "—", "2000"]
    budget = Budget.objects.get(level="member")
    detail = finance.get(reverse("admin:budgets_budget_change", args=[budget.pk]))
    assert detail.status_code == 200 and b"held" in detail.content


def test_budgets_are_not_written_through_the_admin(finance: Client) -> None:
    """Writes go through set_budget (the API), which seeds the current period."""
    tenant = make_tenant()
    budget, _ = set_budget(org=tenant.org, period="month", limit=5_000, enforcement="hard")
    assert finance.get(reverse("admin:budgets_budget_add")).status_code == 403
    finance.post(reverse("admin:budgets_budget_change", args=[budget.pk]), {"limit": 1})
    delete = finance.post(reverse("admin:budgets_budget_delete", args=[budget.pk]), {"post": "yes"})
    assert delete.status_code == 403
    budget.refresh_from_db()
    assert budget.limit == 5_000
    superuser = Client()
    superuser.force_login(UserFactory(is_staff=True, is_superuser=True))
    assert superuser.get(reverse("admin:budgets_budget_add")).status_code == 403  # not even a superuser
    staff = Client()
    staff.force_login(UserFactory(is_staff=True))
    assert staff.get(reverse("admin:budgets_budget_changelist")).status_code == 403  # no view permission


def test_a_redefined_budget_shows_the_current_definitions_period(finance: Client) -> None:
    """QA: after a month budget became a window, the list showed the old month's row (it still
    spans now): held 0 and the month's spent, where the API showed the window's figures."""
    tenant = make_tenant(funds=10_000)
    now = db_now()
    budget, _ = set_budget(org=tenant.org, period="month", limit=5_000, enforcement="hard")
    hold = place_hold(org=tenant.org, amount=1_000, key="h", project=tenant.project, user=tenant.user)
    reserve_budgets(hold=hold, org=tenant.org, project=tenant.project, user=tenant.user, amount=1_000)
    record_capture(hold=hold, amount=400)  # as metering charges: budgets, then the ledger
    capture(hold=hold, amount=400, key="c")
    # After the month began, so the month's row, which keeps its spent, still spans now too.
    set_budget(org=tenant.org, period="window", limit=5_000, enforcement="hard",
               window_start=now - timedelta(seconds=1), window_end=now + timedelta(days=1))
    assert budget.periods.filter(starts_at__lte=now, ends_at__gt=now).count() == 2

    api = client_for(tenant.admin).get(f"/api/v1/orgs/{tenant.org.pk}/budget").json()["current_period"]
    assert (api["held"], api["spent"], api["remaining"]) == (600, 400, 4_000)
    page = finance.get(reverse("admin:budgets_budget_changelist")).content.decode()
    assert _column(page, "held_now") == ["600"]
    assert _column(page, "spent_now") == ["400"]
    assert _column(page, "remaining_now") == ["4000"]


def test_the_list_reads_the_current_periods_in_one_query(finance: Client) -> None:
    """The current figures cost one query for the page, not one (or three) per budget."""
    def queries(tenants: int) -> int:
        for _ in range(tenants):
            tenant = make_tenant()
            set_budget(org=tenant.org, period="month", limit=5_000, enforcement="hard")
            set_budget(org=tenant.org, project=tenant.project, period="month", limit=4_000,
                       enforcement="soft")
        with CaptureQueriesContext(connection) as captured:
            assert finance.get(reverse("admin:budgets_budget_changelist")).status_code == 200
        return len(captured.captured_queries)

    assert queries(1) == queries(3)  # 2 budgets on the page, then 8
