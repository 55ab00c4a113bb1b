"""Hierarchical spending limits (org -> project -> member-in-project) per period."""

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from simple_history.models import HistoricalRecords

from accounts.models import Organization, Project


class BudgetLevel(models.TextChoices):
    ORG = "org"
    PROJECT = "project"
    MEMBER = "member"


class BudgetPeriodKind(models.TextChoices):
    MONTH = "month"  # calendar month, UTC
    WINDOW = "window"  # a fixed [window_start, window_end)


class Enforcement(models.TextChoices):
    HARD = "hard"  # reject what does not fit
    SOFT = "soft"  # accept, record an alert event


class Budget(models.Model):
    """A spending cap on one level of the tenancy hierarchy."""

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="budgets")
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.CASCADE, related_name="budgets"
    )
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    level = models.CharField(max_length=16, choices=BudgetLevel.choices)
    period = models.CharField(max_length=16, choices=BudgetPeriodKind.choices)
    window_start = models.DateTimeField(null=True, blank=True)
    window_end = models.DateTimeField(null=True, blank=True)
    limit = models.BigIntegerField()  # micro-credits per period
    enforcement = models.CharField(max_length=8, choices=Enforcement.choices)
    # False for a window set before it began, until `services.open_started_windows` has counted
    # its period from the scope's activity (as a budget set mid-window is): QA saw holds placed
    # before the start capture inside the window uncounted under a hard limit.
    window_opened = models.BooleanField(default=True, db_default=True)  # db_default: rolling deploys
    created_at = models.DateTimeField(auto_now_add=True)
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(limit__gte=0), name="budget_limit_non_negative"),
            models.CheckConstraint(
                condition=(
                    Q(level="org", project__isnull=True, user__isnull=True)
                    | Q(level="project", project__isnull=False, user__isnull=True)
                    | Q(level="member", project__isnull=False, user__isnull=False)
                ),
                name="budget_level_matches_scope",
            ),
            models.CheckConstraint(
                condition=Q(period="month", window_start__isnull=True, window_end__isnull=True)
                | Q(period="window", window_start__isnull=False, window_end__gt=F("window_start")),
                name="budget_period_well_formed",
            ),
            # One budget per scope: PUT replaces it (nulls compare equal, so one org-level row).
            models.UniqueConstraint(
                fields=["org", "project", "user"],
                name="budget_scope_unique",
                nulls_distinct=False,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.level} budget {self.pk} ({self.enforcement})"


class BudgetPeriod(models.Model):
    """Consumption of one budget in one period: held (reserved) plus spent (captured)."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="periods")
    org_id = models.BigIntegerField(db_index=True)
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    held = models.BigIntegerField(default=0)
    spent = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["budget", "starts_at"], name="budget_period_unique"),
            models.CheckConstraint(
                condition=Q(held__gte=0, spent__gte=0), name="budget_period_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"budget {self.budget_id} from {self.starts_at:%Y-%m-%d}"


class BudgetCharge(models.Model):
    """What one hold counts against one budget period, so releases undo exactly that."""

    period = models.ForeignKey(BudgetPeriod, on_delete=models.CASCADE, related_name="charges")
    hold = models.ForeignKey("ledger.Hold", on_delete=models.PROTECT, related_name="budget_charges")
    held = models.BigIntegerField(default=0)
    spent = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["period", "hold"], name="budget_charge_unique"),
            models.CheckConstraint(
                condition=Q(held__gte=0, spent__gte=0), name="budget_charge_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return f"hold {self.hold_id} on period {self.period_id}"


class RefundedCapture(models.Model):
    """What a refund gave back of one capture of a hold. A budget period that counted the capture
    gets it back (`budgets.refunds`), and a recount of a period subtracts the refunded captures
    made in it, so the credit is not lost."""

    capture = models.ForeignKey("ledger.LedgerTransaction", on_delete=models.PROTECT, related_name="+")
    hold = models.ForeignKey("ledger.Hold", on_delete=models.PROTECT, related_name="+")
    reference = models.CharField(max_length=128)  # the refund's (its bucket's reference)
    amount = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="refunded_capture_amount_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.amount} of capture {self.capture_id} refunded by {self.reference}"
