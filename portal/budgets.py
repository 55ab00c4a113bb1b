"""The budgets a user's panels show: what limits their spending this period, and how much is left.

A member refused with `budget-exceeded` had no way to see the budget in the browser (QA). Who sees
which budget follows the API (`budgets/api/views.py`): the org's budget whoever may read the org's
balance (org members), a project's budget its org's owners and admins (and finance), a member's
budget that member and the owners and admins. This module only reshapes `budgets.selectors` for
display; the counting lives in `budgets.services`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q

from accounts.selectors import is_finance
from budgets.models import Budget, BudgetLevel, BudgetPeriod, BudgetPeriodKind
from budgets.selectors import current_periods
from portal.access import ORG_MANAGER_ROLES, OrgView
from portal.charts import Segment, stacked_bar


@dataclass(frozen=True)
class BudgetLine:
    """One budget as a panel lists it, with its current period's figures."""

    level: str  # org | project | member
    label: str
    enforcement: str  # hard | soft
    limit: int
    held: int
    spent: int
    period: str  # "November 2026 (UTC)", or a window's bounds
    in_effect: bool  # False for a window that does not cover now: it limits nothing yet (or any more)
    segments: list[Segment]

    @property
    def remaining(self) -> int:
        return max(0, self.limit - self.held - self.spent)

    @property
    def over(self) -> bool:
        return self.held + self.spent > self.limit


def _period_label(budget: Budget, starts: datetime | None) -> str:
    if budget.period == BudgetPeriodKind.MONTH and starts is not None:
        return f"{starts:%B %Y} (UTC)"
    return f"window {budget.window_start:%Y-%m-%d %H:%M:%S} to {budget.window_end:%Y-%m-%d %H:%M:%S} UTC"


def _line(budget: Budget, label: str, period: BudgetPeriod | None) -> BudgetLine:
    held, spent = (period.held, period.spent) if period is not None else (0, 0)
    left = max(0, budget.limit - held - spent)
    return BudgetLine(
        level=budget.level, label=label, enforcement=budget.enforcement, limit=budget.limit, held=held,
        spent=spent, period=_period_label(budget, period.starts_at if period is not None else None),
        in_effect=period is not None,
        segments=stacked_bar([("spent", "Spent", spent), ("held", "Held", held),
                              ("available", "Left", left)]),
    )


Lines = list[BudgetLine]


def budgets_for(user: AbstractBaseUser, view: OrgView) -> tuple[Lines, dict[int, Lines]]:
    """(the whole org's budget lines, each visible project's lines by project id) for one org."""
    project_ids = [project.pk for project in view.projects]
    wanted = Q(level=BudgetLevel.MEMBER, project_id__in=project_ids, user_id=user.pk) | Q(
        level=BudgetLevel.PROJECT, project_id__in=project_ids)
    if view.sees_whole_org:
        wanted |= Q(level=BudgetLevel.ORG)
    budgets = list(Budget.objects.filter(wanted, org=view.org).order_by("id"))
    if any(b.level == BudgetLevel.PROJECT for b in budgets) and not (
            view.role in ORG_MANAGER_ROLES or is_finance(user)):  # asked only when it matters
        budgets = [b for b in budgets if b.level != BudgetLevel.PROJECT]
    if not budgets:
        return [], {project_id: [] for project_id in project_ids}
    periods = current_periods(budgets)
    org_lines = [_line(b, "Organization", periods[b.pk]) for b in budgets if b.level == BudgetLevel.ORG]
    names = {project.pk: project.name for project in view.projects}
    by_project: dict[int, list[BudgetLine]] = {}
    for project_id in project_ids:
        lines = list(org_lines)
        for budget in sorted(budgets, key=lambda b: b.level != BudgetLevel.PROJECT):  # project, then yours
            if budget.project_id != project_id:
                continue
            label = (f"Project {names[project_id]}" if budget.level == BudgetLevel.PROJECT
                     else f"Yours in {names[project_id]}")
            lines.append(_line(budget, label, periods[budget.pk]))
        by_project[project_id] = lines
    return org_lines, by_project

