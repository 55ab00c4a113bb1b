"""View-models of the balance page, built from `ledger.selectors.balance_breakdown`.

This module only reshapes the selector's numbers for display (labels, chart geometry); the
balance maths lives in the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import AbstractBaseUser

from accounts.models import Organization, Project
from ledger.selectors import balance_breakdown
from portal.access import OrgView
from portal.budgets import BudgetLine, budgets_for
from portal.charts import Segment, stacked_bar

COLUMNS = ("available", "held", "spent", "expired", "voided")
LABELS = {
    "available": "Available",
    "held": "Held",
    "spent": "Spent",
    "expired": "Expired",
    "voided": "Voided",
}
KIND_LABELS = {"paid": "Paid", "promotional": "Promotional"}
SOON = timedelta(days=7)


@dataclass(frozen=True)
class Amounts:
    """available / held / spent / expired / voided (they add up to granted) in micro-credits."""

    available: int = 0
    held: int = 0
    spent: int = 0
    expired: int = 0
    voided: int = 0
    granted: int = 0

    @classmethod
    def of(cls, data: dict[str, Any]) -> Amounts:
        return cls(**{column: int(data.get(column, 0)) for column in (*COLUMNS, "granted")})

    def segments(self) -> list[Segment]:
        return stacked_bar([(column, LABELS[column], getattr(self, column)) for column in COLUMNS])


@dataclass(frozen=True)
class KindRow:
    key: str
    label: str
    amounts: Amounts


@dataclass(frozen=True)
class BucketRow:
    """One bucket as the page lists it."""

    id: int
    kind: str
    source: str
    scope: str
    status: str  # active | expired | not_yet_effective (as the selector reports it)
    gpu_types: list[str]  # empty = any GPU type
    effective_at: datetime
    expires_at: datetime | None
    expires_soon: bool
    spendable: int
    amounts: Amounts
    segments: list[Segment]
    closed_at: datetime | None = None  # finance closed it (its expiry moved to then)

    @property
    def status_label(self) -> str:
        if self.closed_at is not None:
            return f"closed by finance {self.closed_at:%Y-%m-%d %H:%M} UTC"
        return self.status.replace("_", " ")


@dataclass(frozen=True)
class ProjectUsage:
    """What one project's own jobs hold and have spent, whichever buckets they drew on."""

    held: int
    spent: int


@dataclass(frozen=True)
class Panel:
    """One balance breakdown (a whole org, or one project) ready to render."""

    key: str
    title: str
    subtitle: str
    totals: Amounts
    # Available in buckets active now (not those yet to start); the headline Available is not
    # all spendable, and a bucket limited to some GPU types is spendable on those only.
    spendable: int
    spendable_gpu_limited: int
    kinds: list[KindRow]
    expiring_7d: int
    expiring_30d: int
    buckets: list[BucketRow]
    # A project's panel: its buckets are shared with the org's other projects, so its bucket
    # totals are not its own; these are. None for a whole org.
    project_usage: ProjectUsage | None = None
    segments: list[Segment] = field(default_factory=list)
    budgets: list[BudgetLine] = field(default_factory=list)  # the ones the viewer may see


@dataclass(frozen=True)
class OrgBalance:
    org: Organization
    role: str
    panels: list[Panel]


def _bucket_row(row: dict[str, Any], *, as_of: datetime, project_slugs: dict[int, str]) -> BucketRow:
    amounts = Amounts.of(row)
    expires_at = row["expires_at"]
    return BucketRow(
        id=row["id"],
        kind=row["kind"],
        source=row["source"],
        scope=project_slugs.get(row["project"], "") if row["project"] else "",
        status=row["status"],
        gpu_types=list(row["gpu_types"]),
        effective_at=row["effective_at"],
        expires_at=expires_at,
        expires_soon=row["status"] == "active" and expires_at is not None and expires_at <= as_of + SOON,
        spendable=row["spendable"],
        amounts=amounts,
        segments=amounts.segments(),
        closed_at=row.get("closed_at"),
    )


def _panel(
    *, key: str, title: str, subtitle: str, data: dict[str, Any], project_slugs: dict[int, str],
    budgets: list[BudgetLine],
) -> Panel:
    totals = Amounts.of(data["totals"])
    buckets = [_bucket_row(row, as_of=data["as_of"], project_slugs=project_slugs) for row in data["buckets"]]
    usage = data.get("project_usage")
    return Panel(
        key=key,
        title=title,
        subtitle=subtitle,
        totals=totals,
        spendable=data["totals"]["spendable"],
        spendable_gpu_limited=sum(b.spendable for b in buckets if b.gpu_types),
        kinds=[
            KindRow(key=kind, label=label, amounts=Amounts.of(data[kind]))
            for kind, label in KIND_LABELS.items()
        ],
        expiring_7d=data["expiring"]["7d"],
        expiring_30d=data["expiring"]["30d"],
        buckets=buckets,
        project_usage=ProjectUsage(held=usage["held"], spent=usage["spent"]) if usage is not None else None,
        segments=totals.segments(),
        budgets=budgets,
    )


def org_balances(view: OrgView, user: AbstractBaseUser) -> OrgBalance:
    """The panels a user sees for one org: the whole org (members), then each of their projects."""
    slugs = dict(Project.objects.filter(org=view.org).values_list("id", "slug"))
    org_budgets, project_budgets = budgets_for(user, view)
    panels = []
    if view.sees_whole_org:
        panels.append(
            _panel(key=f"org-{view.org.slug}", title="Whole organization",
                   subtitle="every bucket of the org, project-scoped ones included",
                   data=balance_breakdown(org=view.org), project_slugs=slugs, budgets=org_budgets)
        )
    for project in view.projects:
        panels.append(
            _panel(key=f"project-{view.org.slug}-{project.slug}", title=f"Project {project.name}",
                   subtitle="what this project can spend: its own buckets and the org-wide ones, "
                   "which the org's other projects share",
                   data=balance_breakdown(org=view.org, project=project), project_slugs=slugs,
                   budgets=project_budgets[project.pk])
        )
    return OrgBalance(org=view.org, role=view.role, panels=panels)
