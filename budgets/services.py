"""Budget writes: reserve (check + count a hold), capture, release, extension, and set a limit.

Lock order (DESIGN.md §6): callers lock the idempotency record, job and hold first; budget period
rows are locked here in the order org, project, member, then budget id — always before the
ledger locks buckets. Decisions are made on the locked, re-read rows, so concurrent submissions
can never push a hard budget past its limit.

Semantics: a hold counts as `held` in the period current at reservation (an extension counts in
the period current at extension); a capture moves that amount from held to spent once per budget,
in the period the hold was last counted in there; a release drops held (that period first).
Soft budgets never reject: crossing one writes an audit alert.
A budget set in the middle of its period starts from its scope's activity so far
(`_seed_current_period`), not from zero; so does a window set before it began, once it begins
(`open_started_windows`, beat).
"""

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import Case, F, IntegerField, Q, Sum, Value, When

from accounts.models import Organization, Project
from audit.services import record
from budgets import scope_lock
from budgets.errors import BudgetBeingSet, BudgetExceeded, InvalidBudget, WindowOpening
from budgets.models import (
    Budget,
    BudgetCharge,
    BudgetLevel,
    BudgetPeriod,
    BudgetPeriodKind,
    Enforcement,
)
from budgets.periods import current_bounds, period_bounds
from budgets.selectors import starting_at
from budgets.spent_counts import insert_spent_charges
from config import prepared
from config.clock import db_now
from ledger.models import Hold, HoldState
from ledger.signals import funds_changed

LEVEL_RANK = Case(
    When(budget__level=BudgetLevel.ORG, then=Value(0)),
    When(budget__level=BudgetLevel.PROJECT, then=Value(1)),
    default=Value(2),
    output_field=IntegerField(),
)


@dataclass(frozen=True, slots=True)
class SoftAlert:
    budget_id: int
    level: str
    limit: int
    used: int
    requested: int


def _applicable(org_id: int, project_id: int | None, user_id: int | None) -> list[Budget]:
    """Budgets of the org, the project and the member in it (plain SQL: this runs on every
    submission, where compiling the ORM query cost more than running it)."""
    if connection.vendor != "postgresql":
        # SQLite (the embedded mode) returns raw datetimes naive: its rows need the ORM's converters
        # (QA: any window budget made every submission a 500 in `make run`).
        scope = Q(level=BudgetLevel.ORG) | Q(level=BudgetLevel.PROJECT, project_id=project_id) | Q(
            level=BudgetLevel.MEMBER, project_id=project_id, user_id=user_id)
        return list(Budget.objects.filter(scope, org_id=org_id).order_by("id"))
    fields = [f.attname for f in Budget._meta.concrete_fields]
    cols = ", ".join(f'"{f.column}"' for f in Budget._meta.concrete_fields)
    sql = (
        f"SELECT {cols} FROM {Budget._meta.db_table} "  # noqa: S608 (identifiers from model metadata)
        "WHERE org_id = %s AND (level = %s OR (level = %s AND project_id = %s) "
        "OR (level = %s AND project_id = %s AND user_id = %s)) ORDER BY id"
    )
    params = [org_id, BudgetLevel.ORG.value, BudgetLevel.PROJECT.value, project_id,
              BudgetLevel.MEMBER.value, project_id, user_id]
    rows = prepared.execute(sql, params, fetch="all")  # prepared: planning cost more than running
    return [Budget.from_db(connection.alias, fields, row) for row in rows]


def _lock_periods(match: Q) -> list[BudgetPeriod]:
    """Lock the matching period rows in lock order (level org, project, member; budget id)."""
    return list(
        BudgetPeriod.objects.filter(match)
        .select_related("budget")
        .annotate(level_rank=LEVEL_RANK)
        .order_by("level_rank", "budget_id", "pk")
        .select_for_update(of=("self",))
    )


def _lock_periods_by_id(period_ids: list[int]) -> list[BudgetPeriod]:
    if not period_ids:
        return []
    return _lock_periods(Q(pk__in=period_ids))


def lock_current_periods(
    *, org_id: int, project_id: int | None, user_id: int | None, now: datetime | None = None
) -> list[BudgetPeriod]:
    """Create (if missing) and lock the current period of every applicable budget, in lock order.

    One read when no budget applies; otherwise an idempotent insert of the current periods and
    one locking read of them.
    """
    match = _current_periods(org_id=org_id, project_id=project_id, user_id=user_id, now=now)
    return [] if match is None else _lock_periods(match)


def _current_periods(
    *, org_id: int, project_id: int | None, user_id: int | None, now: datetime | None
) -> Q | None:
    """Create (if missing) the current period of every applicable budget; a filter that selects
    them, or None when there is none."""
    budgets = _applicable(org_id, project_id, user_id)
    wanted = current_bounds(budgets, now or db_now()) if budgets else {}
    if not wanted:
        return None
    BudgetPeriod.objects.bulk_create(
        [BudgetPeriod(budget_id=b, org_id=org_id, starts_at=s, ends_at=e) for b, (s, e) in wanted.items()],
        ignore_conflicts=True,
    )
    return starting_at(wanted)


def lock_periods_ahead(*, extending: Sequence[Hold], releasing: Sequence[Hold]) -> None:
    """Lock at once, in lock order, every period that extending some holds (the current periods
    of their budgets, created if missing) and releasing others (the periods they count in) will
    write, for a caller that then extends and releases them one by one, each extension or release
    locking its buckets: without this it would lock a later hold's periods after an earlier
    hold's buckets, against the order (budgets before buckets) a submission or a charge takes.
    Call it with the holds locked."""
    match = Q(pk__in=BudgetCharge.objects.filter(hold_id__in=[h.pk for h in releasing])
              .values("period_id")) if releasing else None
    now = db_now() if extending else None
    scopes = {(h.org_id, h.project_id or 0, h.user_id or 0) for h in extending}
    for org_id, project_id, user_id in sorted(scopes):  # inserting missing periods in one order
        current = _current_periods(org_id=org_id, project_id=project_id or None, user_id=user_id or None,
                                   now=now)
        if current is not None:
            match = current if match is None else match | current
    if match is not None:
        _lock_periods(match)


def check_periods(periods: list[BudgetPeriod], amount: int, *, new_hold: bool = True) -> list[SoftAlert]:
    """Raise BudgetExceeded on the first hard budget (in lock order) that cannot fit `amount`.

    A hard window that has begun but is not counted yet (`window_opened` False: its holds placed
    before the start are not in the period) refuses a `new_hold` with WindowOpening, a retryable
    BudgetBeingSet, for the seconds until `open_started_windows` counts it (review: checked
    against the partial count, a hard window could still be overspent then). An extension of a
    running hold is checked as usual; the opening recounts it with the rest."""
    alerts: list[SoftAlert] = []
    for period in periods:
        budget = period.budget
        if new_hold and not budget.window_opened and budget.enforcement == Enforcement.HARD:
            raise WindowOpening(level=budget.level, budget_id=budget.pk)
        used = period.held + period.spent
        if used + amount <= budget.limit:
            continue
        if budget.enforcement == Enforcement.HARD:
            raise BudgetExceeded(level=budget.level, limit=budget.limit, used=used,
                                 requested=amount, budget_id=budget.pk)
        alerts.append(SoftAlert(budget.pk, budget.level, budget.limit, used, amount))
    return alerts


def precheck_budgets(
    *, org: Organization, project: Project | None, user: Any, amount: int, now: datetime | None = None,
    wait: bool = True,
) -> tuple[list[BudgetPeriod], list[SoftAlert]]:
    """Lock and check every level before the ledger locks buckets (see module docstring).

    First the org's budget-definition lock, shared (`scope_lock`), so a budget being set counts
    this hold: `wait` for a submission (it holds no other hold); without it (a requeue, which
    may hold other holds of the org that the setting waits for) BudgetBeingSet is raised instead.
    """
    if wait:
        scope_lock.share(org.pk)
    elif not scope_lock.try_share(org.pk):
        raise BudgetBeingSet()
    periods = lock_current_periods(org_id=org.pk, project_id=project.pk if project else None,
                                   user_id=user.pk if user is not None else None, now=now)
    return periods, check_periods(periods, amount)


def _charge_fresh(periods: list[BudgetPeriod], hold: Hold, amount: int) -> list[BudgetCharge]:
    """Count a hold that has no charges yet: two statements whatever the number of levels."""
    if not periods:
        return []
    BudgetPeriod.objects.filter(pk__in=[p.pk for p in periods]).update(held=F("held") + amount)
    return BudgetCharge.objects.bulk_create(
        [BudgetCharge(period=period, hold=hold, held=amount) for period in periods]
    )


def _charge(periods: list[BudgetPeriod], hold: Hold, amount: int) -> list[BudgetCharge]:
    charges = []
    for period in periods:
        BudgetPeriod.objects.filter(pk=period.pk).update(held=F("held") + amount)
        charge, created = BudgetCharge.objects.get_or_create(
            period=period, hold=hold, defaults={"held": amount}
        )
        if not created:
            BudgetCharge.objects.filter(pk=charge.pk).update(held=F("held") + amount)
        charges.append(charge)
    return charges


def _alert(hold: Hold, alerts: list[SoftAlert], action: str, actor: Any = None) -> None:
    """One `budget.soft_limit_exceeded` event per soft level crossed, by `actor`: the user whose
    request placed the hold (a submission), or the system (None: a requeue in a scheduler pass, a
    metering extension, a repricing top-up). QA: a user's submission recorded "System"."""
    for alert in alerts:
        record(action="budget.soft_limit_exceeded", subject_type="budget", subject_id=alert.budget_id,
               org_id=hold.org_id, amount=alert.requested, reason_code="soft_budget_exceeded",
               actor_type="user" if actor is not None else "system",
               actor_id=str(actor.pk) if actor is not None else "",
               data={"level": alert.level, "limit": alert.limit, "used": alert.used,
                     "hold": hold.pk, "on": action})


@transaction.atomic(savepoint=False)
def reserve_budgets(
    *,
    hold: Hold,
    org: Organization,
    project: Project | None,
    user: Any,
    amount: int,
    prechecked: tuple[list[BudgetPeriod], list[SoftAlert]] | None = None,
    fresh: bool = False,
    actor: Any = None,
) -> list[BudgetCharge]:
    """Lock the applicable periods, check hard limits (soft: audit alert), count `amount` as held.

    `prechecked` is what `precheck_budgets` returned earlier in the same transaction (the rows
    are still locked), so they are not locked and checked twice. Idempotent per hold: a hold
    that already has charges is returned unchanged. `fresh`: the caller created the hold in
    this transaction (it cannot have charges), so that lookup is skipped. `actor`: the user whose
    request places the hold, recorded on soft-limit alerts (None: the system).
    """
    if not fresh:
        existing = list(BudgetCharge.objects.filter(hold=hold))
        if existing:
            return existing
    periods, alerts = prechecked or precheck_budgets(org=org, project=project, user=user, amount=amount)
    charges = _charge_fresh(periods, hold, amount) if fresh else _charge(periods, hold, amount)
    _alert(hold, alerts, "reserve", actor)
    return charges


@transaction.atomic
def record_extension(*, hold: Hold, amount: int) -> list[BudgetCharge]:
    """Count an extension of `hold` in the current periods (raises BudgetExceeded on hard)."""
    periods = lock_current_periods(org_id=hold.org_id, project_id=hold.project_id, user_id=hold.user_id)
    alerts = check_periods(periods, amount, new_hold=False)
    charges = _charge(periods, hold, amount)
    _alert(hold, alerts, "extend")
    return charges


def _locked_charges(hold: Hold) -> list[tuple[BudgetCharge, BudgetPeriod]]:
    charges = {c.period_id: c for c in BudgetCharge.objects.filter(hold=hold)}
    periods = _lock_periods_by_id(list(charges))
    # Re-read the charges after the period locks: every writer of a charge holds its period.
    fresh = {c.period_id: c for c in BudgetCharge.objects.filter(hold=hold)}
    return [(fresh[p.pk], p) for p in periods if p.pk in fresh] if charges else []


def split_per_budget(
    charges: Sequence[tuple[int, int, int, int]], amount: int
) -> list[tuple[int, int, bool]]:
    """Where `amount` of one hold leaves `held`: [(charge index, moved, takes the spend)].

    `charges` are the hold's (index, budget id, charge id, held). The amount counts once per
    budget: a hold extended into a later period has a charge in each period of the same budget,
    and the amount is taken from them newest charge first (the period it was last counted in:
    an extension's, or the one a redefinition seeded), never below zero; a capture's spend goes
    to the newest (review: every period of the budget counted it, so a capture after an
    extension into a new month was spent twice in the budget)."""
    by_budget: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for index, budget_id, charge_id, held in charges:
        by_budget[budget_id].append((index, charge_id, held))
    out = []
    for group in by_budget.values():
        left = amount
        for n, (index, _charge, held) in enumerate(sorted(group, key=lambda c: c[1], reverse=True)):
            moved = min(left, held)
            left -= moved
            out.append((index, moved, n == 0))
    return out


def _move_charges(hold: Hold, amount: int, *, spend: bool) -> None:
    pairs = _locked_charges(hold)
    rows = [(i, period.budget_id, charge.pk, charge.held) for i, (charge, period) in enumerate(pairs)]
    for index, moved, latest in split_per_budget(rows, amount):
        spent = amount if spend and latest else 0
        if moved or spent:
            charge, period = pairs[index]
            BudgetCharge.objects.filter(pk=charge.pk).update(held=F("held") - moved, spent=F("spent") + spent)
            BudgetPeriod.objects.filter(pk=period.pk).update(held=F("held") - moved, spent=F("spent") + spent)


@transaction.atomic
def record_capture(*, hold: Hold, amount: int) -> None:
    """Move `amount` of `hold` from held to spent in every budget it counts in."""
    if amount > 0:
        _move_charges(hold, amount, spend=True)


@transaction.atomic
def record_release(*, hold: Hold, amount: int) -> None:
    """Drop `amount` of `hold` from held in every budget it counts in (never below zero)."""
    if amount > 0:
        _move_charges(hold, amount, spend=False)


@transaction.atomic(savepoint=False)
def record_release_many(*, items: Sequence[tuple[Hold, int]]) -> None:
    """`record_release` for many holds: every period they count in locked once, in the usual
    lock order (level org, project, member; budget id), then one UPDATE for the charges and one
    for the periods. Call it with the holds locked, before the ledger locks buckets."""
    amounts = {hold.pk: amount for hold, amount in items if amount > 0}
    if len(amounts) != len([1 for _, amount in items if amount > 0]):
        raise ValueError("record_release_many takes each hold at most once")
    if not amounts:
        return
    period_ids = sorted(set(
        BudgetCharge.objects.filter(hold_id__in=list(amounts)).values_list("period_id", flat=True)
    ))
    if not period_ids:
        return
    periods = {p.pk: p for p in _lock_periods_by_id(period_ids)}
    # Re-read the charges after the period locks: every writer of a charge holds its period.
    by_hold: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for charge_id, hold_id, period_id, held in BudgetCharge.objects.filter(
        hold_id__in=list(amounts), period_id__in=period_ids
    ).order_by("pk").values_list("pk", "hold_id", "period_id", "held"):
        by_hold[hold_id].append((charge_id, period_id, held))
    charge_ids, charge_moves, period_moves = [], [], defaultdict(int)
    for hold_id, charges in by_hold.items():
        rows = [(i, periods[p].budget_id, charge_id, held) for i, (charge_id, p, held) in enumerate(charges)]
        for index, moved, _latest in split_per_budget(rows, amounts[hold_id]):
            if moved:
                charge_id, period_id, _held = charges[index]
                charge_ids.append(charge_id)
                charge_moves.append(moved)
                period_moves[period_id] += moved
    if not charge_ids:
        return
    if connection.vendor != "postgresql":
        for charge_id, moved in zip(charge_ids, charge_moves, strict=True):
            BudgetCharge.objects.filter(pk=charge_id).update(held=F("held") - moved)
        for period_id, moved in period_moves.items():
            BudgetPeriod.objects.filter(pk=period_id).update(held=F("held") - moved)
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH c AS (UPDATE {BudgetCharge._meta.db_table} AS t SET held = t.held - v.m "  # noqa: S608
            "FROM unnest(%s::bigint[], %s::bigint[]) AS v(id, m) WHERE t.id = v.id RETURNING t.id) "
            f"UPDATE {BudgetPeriod._meta.db_table} AS t SET held = t.held - v.m "
            "FROM unnest(%s::bigint[], %s::bigint[]) AS v(id, m) WHERE t.id = v.id",
            [charge_ids, charge_moves, list(period_moves), list(period_moves.values())],
        )


def _is_scope_conflict(error: IntegrityError) -> bool:
    diag = getattr(error.__cause__, "diag", None)
    if diag is not None:  # PostgreSQL names the violated constraint
        return diag.constraint_name == "budget_scope_unique"
    return "UNIQUE constraint failed" in str(error)  # embedded SQLite


@transaction.atomic
def set_budget(
    *,
    org: Organization,
    project: Project | None = None,
    user: Any = None,
    period: str,
    limit: int,
    enforcement: str,
    window_start: datetime | None = None,
    window_end: datetime | None = None,
    actor: Any = None,
) -> tuple[Budget, bool]:
    """Create or replace the budget of one scope (org, project, or member in project)."""
    if project is not None and project.org_id != org.pk:
        raise InvalidBudget("The project belongs to another organization.", field="project")
    if user is not None and project is None:
        raise InvalidBudget("A member budget needs a project.", field="project")
    if not isinstance(limit, int) or limit < 0:
        raise InvalidBudget("The limit is a non-negative integer of micro-credits.", field="limit")
    if period == BudgetPeriodKind.WINDOW:
        if window_start is None or window_end is None or window_end <= window_start:
            raise InvalidBudget("A window budget needs window_start < window_end.", field="window_end")
    else:
        window_start = window_end = None
    level = BudgetLevel.MEMBER if user is not None else (
        BudgetLevel.PROJECT if project is not None else BudgetLevel.ORG
    )
    scope_lock.own(org.pk)  # every hold still in flight commits first, so the seeding counts it
    fields = {"level": level, "period": period, "limit": limit, "enforcement": enforcement,
              "window_start": window_start, "window_end": window_end}
    # FOR NO KEY UPDATE: a first period row of this budget inserted by an extension (which takes
    # no scope lock) checks its foreign key at commit with FOR KEY SHARE on this row, holding its
    # hold, which the seeding below locks: FOR UPDATE made that a deadlock (review).
    scope = Budget.objects.select_for_update(no_key=True).filter(org=org, project=project, user=user)
    budget = scope.first()
    created = False
    if budget is None:
        try:
            with transaction.atomic():  # a concurrent PUT may create this scope's row first
                budget = Budget.objects.create(org=org, project=project, user=user, **fields)
            created = True
        except IntegrityError as error:
            if not _is_scope_conflict(error):
                raise
            # The other PUT committed this scope's row first: replace it like any update.
            budget = scope.get()
    redefined = created or (budget.period, budget.window_start, budget.window_end) != (
        period, window_start, window_end)
    before = None if created else _audited(budget)
    if not created:
        for name, value in fields.items():
            setattr(budget, name, value)
        budget.save()
    if redefined:
        now = db_now()
        _seed_current_period(budget, now=now)
        opened = period != BudgetPeriodKind.WINDOW or window_start <= now
        if budget.window_opened != opened:
            Budget.objects.filter(pk=budget.pk).update(window_opened=opened)
            budget.window_opened = opened
    record(action="budget.set", subject_type="budget", subject_id=budget.pk, org_id=org.pk,
           amount=limit, actor_type="user" if actor is not None else "system",
           actor_id=str(actor.pk) if actor is not None else "",
           data={"level": level, **_audited(budget), "before": before,
                 "project": project.pk if project else None, "user": user.pk if user else None})
    funds_changed.send(sender=Budget, org_id=org.pk)
    return budget, created


def open_started_windows(*, now: datetime | None = None) -> int:
    """Count the period of every window budget set before its window began, now that it has
    begun, from its scope's activity (`_seed_current_period`): the holds still active (placed
    before the window too) as held, the captures since the start as spent: what setting the
    same budget mid-window gives (QA: holds placed before the start went on capturing inside
    the window uncounted, and a hard limit could be overspent). Run every few seconds by beat;
    until then a hard window refuses new holds (`check_periods`: WindowOpening, retryable). A
    window that ended before it was opened (beat down throughout) is recorded `counted: false`
    with the figures its period has. Returns how many were handled."""
    due = list(Budget.objects.filter(period=BudgetPeriodKind.WINDOW, window_opened=False,
                                     window_start__lte=now or db_now()).values_list("pk", "org_id"))
    opened = 0
    for budget_id, org_id in due:
        with transaction.atomic():
            scope_lock.own(org_id)  # as set_budget: every hold in flight commits first
            budget = Budget.objects.select_for_update(no_key=True).filter(
                pk=budget_id, window_opened=False).first()
            at = db_now()
            if budget is None or budget.window_start > at:  # opened meanwhile, or redefined
                continue
            period = _seed_current_period(budget, now=at)
            Budget.objects.filter(pk=budget.pk).update(window_opened=True)
            counted = period is not None
            if period is None:  # the window ended before it could be counted (beat was down)
                period = BudgetPeriod.objects.filter(budget=budget, starts_at=budget.window_start).first()
            record(action="budget.window_opened", subject_type="budget", subject_id=budget.pk,
                   org_id=org_id, actor_type="system", actor_id="",
                   reason_code="" if counted else "window_ended",
                   data={**_audited(budget), "counted": counted, "held": period.held if period else 0,
                         "spent": period.spent if period else 0})
            opened += 1
        funds_changed.send(sender=Budget, org_id=org_id)
    return opened


def _audited(budget: Budget) -> dict[str, Any]:
    """A budget's definition as its `budget.set` event records it (QA: the limit and the window
    were missing, and so was what a change replaced)."""
    return {"limit": budget.limit, "period": budget.period, "enforcement": budget.enforcement,
            "window_start": budget.window_start.isoformat() if budget.window_start else None,
            "window_end": budget.window_end.isoformat() if budget.window_end else None}


def _seed_current_period(budget: Budget, *, now: datetime) -> BudgetPeriod | None:
    """Start a budget set mid-period from what its scope already did in the period (QA: a month
    budget set on the 22nd started at zero, and holds placed before it counted only in part).

    `spent` = the scope's captures since the period began, less what refunds gave back of them
    (`budgets.refunds`); `held` = what its active holds still hold; each hold counted by a charge
    (its held and spent), so their later captures and releases move the period like any
    other hold's. A period row left from an earlier definition with the same start (window ->
    month -> the same window again) is counted afresh too: its old counts missed what happened
    under the other definition (QA). A hold still in flight is counted too: `set_budget` took the
    org's budget-definition lock first, which waits for it (`scope_lock`)."""
    bounds = period_bounds(period=budget.period, window_start=budget.window_start,
                           window_end=budget.window_end, now=now)
    if bounds is None:
        return None
    starts, ends = bounds
    scope = Q(org_id=budget.org_id)
    if budget.project_id is not None:
        scope &= Q(project_id=budget.project_id)
    if budget.user_id is not None:
        scope &= Q(user_id=budget.user_id)
    # Lock the scope's active holds first (the lock order: holds, then budget periods), so no
    # capture, extension or release moves them between the two reads below (review: a capture
    # committing in between was counted twice or not at all).
    active = list(
        Hold.objects.select_for_update(of=("self",)).filter(scope, state=HoldState.ACTIVE).order_by("pk")
        .values_list("pk", "authorized", "captured", "released")
    )
    period, fresh = BudgetPeriod.objects.get_or_create(
        budget=budget, starts_at=starts, defaults={"ends_at": ends, "org_id": budget.org_id}
    )
    if not fresh:
        (period,) = _lock_periods_by_id([period.pk])  # submissions count into it under this lock
        BudgetCharge.objects.filter(period=period).delete()
        BudgetPeriod.objects.filter(pk=period.pk).update(ends_at=ends)
    # One charge per hold counted (its spent, its held, or both), so a refund later finds what it
    # spent here: the spending by one statement, then the active holds' held.
    insert_spent_charges(period, budget, starts, ends)
    held = {hold_id: authorized - captured - released for hold_id, authorized, captured, released in active
            if authorized - captured - released > 0}
    # One upsert (review: bulk_update's CASE per row grew with the square of the active holds).
    BudgetCharge.objects.bulk_create([BudgetCharge(period=period, hold_id=hold_id, held=amount)
                                      for hold_id, amount in held.items()],
                                     update_conflicts=True, unique_fields=["period", "hold"],
                                     update_fields=["held"])
    totals = BudgetCharge.objects.filter(period=period).aggregate(held=Sum("held"), spent=Sum("spent"))
    period.held, period.spent = totals["held"] or 0, totals["spent"] or 0
    BudgetPeriod.objects.filter(pk=period.pk).update(held=period.held, spent=period.spent)
    _move_from_other_periods(budget, period, list(held))
    return period


def _move_from_other_periods(budget: Budget, current: BudgetPeriod, hold_ids: list[int]) -> None:
    """The seeding counts each active hold's whole remaining amount in the current period: its
    charges in the budget's other periods (an earlier definition's window) give theirs up, so a
    hold's charges in one budget always add up to what it holds (review: a copy there took a
    later capture first, and the current period kept the hold's amount as held for ever). The
    holds are locked, so nothing else moves these charges meanwhile."""
    stale = BudgetCharge.objects.filter(period__budget=budget, hold_id__in=hold_ids, held__gt=0).exclude(
        period=current
    )
    by_period: dict[int, int] = defaultdict(int)
    for period_id, amount in stale.values_list("period_id", "held"):
        by_period[period_id] += amount
    if not by_period:
        return
    _lock_periods_by_id(sorted(by_period))
    stale.update(held=0)
    for period_id, amount in by_period.items():
        BudgetPeriod.objects.filter(pk=period_id).update(held=F("held") - amount)
