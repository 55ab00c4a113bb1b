"""A refund gives the budgets their room back: what finance refunded of a job's charges leaves
`spent` in the budget periods those charges were counted in (docs/budgets.md, "Refunds").

A refund is first laid on the job's holds' captures (`RefundedCapture`): each hold's captures
end to end in time order, the refund takes the newest stretch not refunded yet, of the attempt it
names first, then of the job's other attempts, newest first (`take_from_top`). Then

- the periods that counted those captures get them back now, per budget newest period first,
  never more than the hold spent there (`BudgetCharge.spent`), and
- a later recount of a period (a budget set or redefined, a window opening:
  `services._seed_current_period`) subtracts what of the stretches fell in it
  (`refunded_in_window`), so the credit is not lost (review, session 17: it was).

Periods are locked in lock order after the job and before the ledger's buckets; the org's
budget-definition lock is taken shared first, so a recount in flight commits first and a later
one sees the stretches (`budgets/scope_lock.py`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.db import transaction
from django.db.models import F, QuerySet, Sum

from budgets import scope_lock
from budgets.models import BudgetCharge, BudgetPeriod, RefundedCapture
from ledger.models import Hold, LedgerTransaction, TransactionKind

Stretch = tuple[int, int]  # (lo, hi]: positions in a hold's captures laid end to end


def take_from_top(captured: int, taken: Iterable[Stretch], amount: int) -> list[Stretch]:
    """The newest stretches of `(0, captured]` that are not in `taken`, adding up to at most
    `amount`, newest first."""
    out: list[Stretch] = []
    top = captured
    for lo, hi in sorted(taken, key=lambda s: s[1], reverse=True):
        if amount <= 0:
            break
        if hi < top:  # the free gap (hi, top] above this stretch
            take = min(amount, top - hi)
            out.append((top - take, top))
            amount -= take
        top = min(top, lo)
    if amount > 0 and top > 0:
        take = min(amount, top)
        out.append((top - take, top))
    return out


def _captures_before(hold_ids: Iterable[int], at: datetime | None) -> dict[int, int]:
    """Per hold: the sum of its captures made before `at` (all of them when None)."""
    rows = LedgerTransaction.objects.filter(kind=TransactionKind.CAPTURE, hold_id__in=list(hold_ids))
    if at is not None:
        rows = rows.filter(created_at__lt=at)
    return dict(rows.values("hold_id").annotate(total=Sum("amount")).values_list("hold_id", "total"))


def refunded_in_window(holds: QuerySet[Hold], starts: datetime, ends: datetime) -> dict[int, int]:
    """Per hold of `holds`: how much of its captures made in `[starts, ends)` was refunded."""
    stretches = list(RefundedCapture.objects.filter(hold__in=holds).values_list("hold_id", "lo", "hi"))
    if not stretches:
        return {}
    holds = {hold_id for hold_id, _, _ in stretches}
    before_start, before_end = _captures_before(holds, starts), _captures_before(holds, ends)
    out: dict[int, int] = defaultdict(int)
    for hold_id, lo, hi in stretches:
        out[hold_id] += max(0, min(hi, before_end.get(hold_id, 0)) - max(lo, before_start.get(hold_id, 0)))
    return dict(out)


@transaction.atomic(savepoint=False)
def record_refund(*, org_id: int, hold_ids: Sequence[int], amount: int, reference: str) -> dict[int, int]:
    """Lay `amount` refunded on the captures of `hold_ids` (in the order given) and credit the
    budget periods that counted them. Returns {budget id: amount credited}."""
    scope_lock.share(org_id)
    captured = _captures_before(hold_ids, None)
    taken: dict[int, list[Stretch]] = defaultdict(list)
    for hold_id, lo, hi in RefundedCapture.objects.filter(hold_id__in=list(hold_ids)).values_list(
            "hold_id", "lo", "hi"):
        taken[hold_id].append((lo, hi))
    rows: list[RefundedCapture] = []
    per_hold: dict[int, int] = {}
    left = amount
    for hold_id in hold_ids:
        stretches = take_from_top(captured.get(hold_id, 0), taken[hold_id], left)
        rows += [RefundedCapture(hold_id=hold_id, reference=reference, lo=lo, hi=hi) for lo, hi in stretches]
        if stretches:
            per_hold[hold_id] = sum(hi - lo for lo, hi in stretches)
            left -= per_hold[hold_id]
    RefundedCapture.objects.bulk_create(rows)
    return _credit_charges(per_hold)


def _credit_charges(per_hold: dict[int, int]) -> dict[int, int]:
    """Per budget, give each hold's amount back to the periods it spent in, newest first."""
    from budgets.services import _lock_periods_by_id  # the one place that knows the lock order

    spending = BudgetCharge.objects.filter(hold_id__in=list(per_hold), spent__gt=0)
    period_ids = sorted(set(spending.values_list("period_id", flat=True)))
    periods = {p.pk: p for p in _lock_periods_by_id(period_ids)}
    # Re-read the charges under the period locks: every writer of a charge holds its period.
    fresh = spending.filter(period_id__in=list(periods)).values_list("pk", "period_id", "hold_id", "spent")
    charges = sorted(fresh, key=lambda c: (periods[c[1]].starts_at, c[0]), reverse=True)
    left: dict[tuple[int, int], int] = {}
    credited: dict[int, int] = defaultdict(int)
    for charge_id, period_id, hold_id, spent in charges:
        budget_id = periods[period_id].budget_id
        take = min(left.setdefault((budget_id, hold_id), per_hold[hold_id]), spent)
        if take <= 0:
            continue
        left[budget_id, hold_id] -= take
        credited[budget_id] += take
        BudgetCharge.objects.filter(pk=charge_id).update(spent=F("spent") - take)
        BudgetPeriod.objects.filter(pk=period_id).update(spent=F("spent") - take)
    return dict(credited)
