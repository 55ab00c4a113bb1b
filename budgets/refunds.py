"""A refund gives the budgets their room back: what finance refunded of a job's charges leaves
`spent` in the budget periods that counted those charges (docs/api.md, "Budgets").

A refund is first laid on the job's captures (`RefundedCapture`, one row per capture it gives
back): newest capture first, of the hold of the attempt it names first, then of the job's other
attempts, newest first (`take_newest`). Then

- the periods that counted the job's spending get it back now: per budget and hold, the period
  in force first (review: after a redefinition, window -> month -> the same window, the older row
  is the one in force), then the hold's newest charge (the period it was last counted in, as a
  capture's spend goes there: `services.split_per_budget`), never more than the hold spent there
  (`BudgetCharge.spent`);
- a later recount of a period (a budget set or redefined, a window opening:
  `services._seed_current_period`) subtracts the refunded captures made in it, so the credit is
  not lost (review, session 17: it was).

Periods are locked in lock order after the job and before the ledger's buckets; the org's
budget-definition lock is taken shared first, so a recount in flight commits first and a later
one sees the refunded captures (`budgets/scope_lock.py`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from django.db import transaction
from django.db.models import F, Sum

from budgets import scope_lock
from budgets.models import BudgetCharge, BudgetPeriod, RefundedCapture
from budgets.periods import current_bounds
from config.clock import db_now
from ledger.models import Hold, LedgerTransaction, TransactionKind

Capture = tuple[int, int]  # (capture transaction id, what of it is not refunded yet)


def take_newest(captures: Iterable[Capture], amount: int) -> list[Capture]:
    """[(capture id, amount)] adding up to at most `amount`, taken from the newest captures (the
    highest ids: a hold's captures are made one at a time under its lock) down."""
    out: list[Capture] = []
    for capture_id, left in sorted(captures, reverse=True):
        if amount <= 0:
            break
        take = min(left, amount)
        if take > 0:
            out.append((capture_id, take))
            amount -= take
    return out


def _unrefunded(hold_ids: Sequence[int]) -> dict[int, list[Capture]]:
    """Per hold: its captures with what of each no refund has given back yet."""
    refunded = dict(RefundedCapture.objects.filter(hold_id__in=list(hold_ids)).values("capture_id")
                    .annotate(total=Sum("amount")).values_list("capture_id", "total"))
    out: dict[int, list[Capture]] = defaultdict(list)
    rows = LedgerTransaction.objects.filter(kind=TransactionKind.CAPTURE, hold_id__in=list(hold_ids))
    for capture_id, hold_id, amount in rows.values_list("pk", "hold_id", "amount"):
        out[hold_id].append((capture_id, amount - refunded.get(capture_id, 0)))
    return out


@transaction.atomic(savepoint=False)
def record_refund(*, org_id: int, hold_ids: Sequence[int], amount: int, reference: str) -> dict[int, int]:
    """Lay `amount` refunded on the captures of `hold_ids` (in the order given) and credit the
    budget periods that counted them. Returns {budget id: amount credited}."""
    scope_lock.share(org_id)
    # The holds next (lock order: job, this scope lock, holds, periods, buckets), so no capture
    # commits between the read of the captures and the credit of the charges (review: the
    # stranded-hold sweep captures under the hold lock alone, and its capture took the credit).
    list(Hold.objects.select_for_update().filter(pk__in=list(hold_ids)).order_by("pk").values_list("pk"))
    captures = _unrefunded(hold_ids)
    rows: list[RefundedCapture] = []
    per_hold: dict[int, int] = {}
    left = amount
    for hold_id in hold_ids:
        taken = take_newest(captures[hold_id], left)
        rows += [RefundedCapture(capture_id=capture_id, hold_id=hold_id, reference=reference, amount=part)
                 for capture_id, part in taken]
        if taken:
            per_hold[hold_id] = sum(a for _, a in taken)
            left -= per_hold[hold_id]
    RefundedCapture.objects.bulk_create(rows)
    return _credit_charges(per_hold)


def _credit_charges(per_hold: dict[int, int]) -> dict[int, int]:
    """Per budget, give each hold's amount back to the periods it spent in: the period in force
    first, then newest charge first."""
    from budgets.services import _lock_periods_by_id  # the one place that knows the lock order

    spending = BudgetCharge.objects.filter(hold_id__in=list(per_hold), spent__gt=0)
    period_ids = sorted(set(spending.values_list("period_id", flat=True)))
    periods = {p.pk: p for p in _lock_periods_by_id(period_ids)}
    in_force = current_bounds([p.budget for p in periods.values()], db_now())
    # Re-read the charges under the period locks: every writer of a charge holds its period.
    fresh = spending.filter(period_id__in=list(periods)).values_list("pk", "period_id", "hold_id", "spent")

    def order(charge: tuple[int, int, int, int]) -> tuple[bool, int]:
        period = periods[charge[1]]
        bounds = in_force.get(period.budget_id)
        return bounds is None or bounds[0] != period.starts_at, -charge[0]

    left: dict[tuple[int, int], int] = {}
    credited: dict[int, int] = defaultdict(int)
    for charge_id, period_id, hold_id, spent in sorted(fresh, key=order):
        budget_id = periods[period_id].budget_id
        take = min(left.setdefault((budget_id, hold_id), per_hold[hold_id]), spent)
        if take <= 0:
            continue
        left[budget_id, hold_id] -= take
        credited[budget_id] += take
        BudgetCharge.objects.filter(pk=charge_id).update(spent=F("spent") - take)
        BudgetPeriod.objects.filter(pk=period_id).update(spent=F("spent") - take)
    return dict(credited)
