"""Budgets in the admin, read-only: finance sees every scope's limit and its current period.

Budgets are written only through `budgets.services.set_budget` (the API's `PUT .../budget`
routes), which also seeds the current period from what the scope already did in it; a budget
saved here would skip that, so nothing is added, changed or deleted through the admin.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import F
from django.http import HttpRequest, HttpResponse

from budgets.models import Budget, BudgetPeriod, BudgetPeriodKind
from budgets.selectors import current_periods
from config.history_admin import ViewOnlyHistoryAdmin
from config.readonly_admin import ReadOnlyAdminMixin

HOW_TO_SET = (
    "Budgets are read-only here. They are set through the API: PUT /api/v1/orgs/{id}/budget, "
    "/api/v1/projects/{id}/budget and /api/v1/projects/{id}/members/{user_id}/budget (org owners and "
    "admins, finance), whose service also counts what the scope already held and spent in the period "
    "(docs/api.md, Budgets). Amounts are micro-credits."
)


class BudgetPeriodInline(ReadOnlyAdminMixin, admin.TabularInline):
    """The budget's periods, newest first: what each held and spent."""

    model = BudgetPeriod
    fields = ("starts_at", "ends_at", "held", "spent")
    readonly_fields = fields
    ordering = ("-starts_at",)
    extra = 0
    can_delete = False


class _BudgetChangeList(ChangeList):
    """The page's budgets each carry their current period (`_current_period`), read by the API's
    selector in one query for the page (QA: the admin's own "any period row spanning now" showed
    an old definition's row after a budget's period or window changed, not what the API showed)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        page = list(self.result_list)  # evaluates the page's queryset; its cached rows are rendered
        periods = current_periods(page)
        for budget in page:
            budget._current_period = periods[budget.pk]  # type: ignore[attr-defined]


@admin.register(Budget)
class BudgetAdmin(ReadOnlyAdminMixin, ViewOnlyHistoryAdmin):
    list_display = ("id", "org", "scope", "level", "period_shown", "limit", "enforcement", "held_now",
                    "spent_now", "remaining_now")
    list_filter = ("level", "period", "enforcement")
    search_fields = ("org__slug", "project__slug", "user__username")
    list_select_related = ("org", "project__org", "user")  # a project shows as org/project
    # Org, then its project budgets each followed by their members' (the org's own first).
    ordering = ("org__slug", F("project__slug").asc(nulls_first=True),
                F("user__username").asc(nulls_first=True))
    fieldsets = ((None, {
        "description": HOW_TO_SET,
        "fields": ("org", "project", "user", "level", "period", "window_start", "window_end", "limit",
                   "enforcement", "created_at"),
    }),)
    inlines = (BudgetPeriodInline,)

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return _BudgetChangeList

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
                        ) -> HttpResponse:
        return super().changelist_view(request, {"how_to_set": HOW_TO_SET, **(extra_context or {})})

    @admin.display(description="scope")
    def scope(self, budget: Budget) -> str:
        """org, org/project, or org/project: user for a member-in-project budget."""
        if budget.project is None:
            return budget.org.slug
        return f"{budget.project}: {budget.user}" if budget.user is not None else str(budget.project)

    @admin.display(description="period", ordering="period")
    def period_shown(self, budget: Budget) -> str:
        if budget.period == BudgetPeriodKind.WINDOW:
            return f"window {budget.window_start:%Y-%m-%d %H:%M} to {budget.window_end:%Y-%m-%d %H:%M} UTC"
        return "calendar month (UTC)"

    @staticmethod
    def _current(budget: Budget, field: str) -> int | str:
        # A window that does not cover now has no current period ("—"); a period nothing was
        # counted in yet has no row (the selector gives an unsaved one): zero.
        period = getattr(budget, "_current_period", None)
        if period is None:
            return "—"
        return int(getattr(period, field))

    @admin.display(description="held now")
    def held_now(self, budget: Budget) -> int | str:
        return self._current(budget, "held")

    @admin.display(description="spent now")
    def spent_now(self, budget: Budget) -> int | str:
        return self._current(budget, "spent")

    @admin.display(description="remaining now")
    def remaining_now(self, budget: Budget) -> int | str:
        held, spent = self._current(budget, "held"), self._current(budget, "spent")
        if isinstance(held, str) or isinstance(spent, str):
            return "—"
        return max(0, budget.limit - held - spent)
