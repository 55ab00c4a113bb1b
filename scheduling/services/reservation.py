"""Pricing and placing a job's hold: budgets at every level, then the funds (DESIGN.md §4-§6)."""

import json
from datetime import datetime
from typing import Any

from django.db import transaction

from budgets.errors import BudgetExceeded
from budgets.services import precheck_budgets, reserve_budgets
from config.clock import db_now
from config.errors import DomainError
from ledger.errors import InsufficientCredits
from ledger.models import Hold
from ledger.money import format_credits
from ledger.services import CallerEvent, place_hold
from ledger.services.holds import funds_for, spendable_by_gpu_types
from scheduling.core.feasibility import Never, why_never_fits, why_over_quota
from scheduling.models import Job
from scheduling.pricing import (
    Catalog,
    Quote,
    catalog,
    catalog_knowing,
    cost,
    current_prices,
    held_seconds,
    hold_amount,
    hold_quote,
)


class NoEligibleGpuType(DomainError):
    """None of the job's acceptable GPU types meets its per-GPU memory floor."""

    type = "validation-error"
    status = 400
    title = "No acceptable GPU type"


def eligible_types(gpu_types: list[str], gpu_memory_gb: int, snap: Catalog | None = None) -> list[str]:
    """The acceptable types (in preference order) whose memory meets the per-GPU floor."""
    memory = (snap or catalog_knowing(gpu_types=gpu_types)).memory_gb
    eligible = [name for name in gpu_types if memory.get(name, -1) >= gpu_memory_gb]
    if not eligible:
        raise NoEligibleGpuType(
            f"No GPU type in {gpu_types} has {gpu_memory_gb} GB per GPU.",
            errors={"gpu_memory_gb": ["No acceptable GPU type has this much memory per GPU."]},
        )
    return eligible


class NeverRunnable(DomainError):
    """No acceptable GPU type could ever run the job: it would wait forever with credits held."""

    type = "validation-error"
    status = 400
    title = "The job can never run"


_FIELD = {"type": "gpu_types", "regions": "regions", "size": "gpu_count"}


def why_never_runs(snap: Catalog, types: list[str], gpu_count: int, regions: tuple[str, ...],
               org_id: int, project_id: int) -> dict[str, Never] | None:
    """Per type, why it can never run the job; None as soon as one type could."""
    why: dict[str, Never] = {}
    for name in types:
        never = _never_on(snap, name, gpu_count, regions, org_id, project_id)
        if never is None:
            return None
        why[name] = never
    return why


def _never_on(snap: Catalog, name: str, gpu_count: int, regions: tuple[str, ...], org_id: int,
              project_id: int) -> Never | None:
    """Why type `name` can never run the gang (its fleet in the regions, then the quotas), or None."""
    return why_never_fits(snap.fleet, name, gpu_count, regions) or why_over_quota(
        snap.quotas, org_id, project_id, name, gpu_count)


def runnable_types(snap: Catalog, types: list[str], gpu_count: int, regions: tuple[str, ...],
                   org_id: int, project_id: int) -> list[str]:
    """Those of `types` the job could ever run on (its gang against the fleet in its regions, its
    size against its quotas): the hold is priced at the dearest of these, not of types it can
    never use (QA: a job accepting H100 and T4 in a region with T4 nodes only held H100's price,
    4x too much until placed). All of `types` when none could (the submission is refused then)."""
    usable = [name for name in types if _never_on(snap, name, gpu_count, regions, org_id, project_id) is None]
    return usable or types


def check_can_ever_run(*, snap: Catalog, types: list[str], gpu_count: int, regions: tuple[str, ...],
                       org_id: int, project_id: int) -> None:
    """Refuse a job that no registered node set (as if all were up and idle) could ever hold, or
    that is larger than a concurrent-GPU quota, on every type it accepts (Slurm refuses such jobs
    at submission too). A refusal is re-checked on a fresh catalog first: a node registered in
    another process within the cache's TTL must not make a good job bounce."""
    if why_never_runs(snap, types, gpu_count, regions, org_id, project_id) is None:
        return
    why = why_never_runs(catalog(fresh=True), types, gpu_count, regions, org_id, project_id)
    if why is None:
        return
    errors: dict[str, list[str]] = {}
    for name, never in why.items():
        errors.setdefault(_FIELD[never.cause], []).append(f"{name}: {never.message}.")
    reasons = "; ".join(f"{name}: {never.message}" for name, never in why.items())
    raise NeverRunnable(f"No GPU type this job accepts could ever run it ({reasons}).", errors=errors)


def eligible_gpu_types(job: Job) -> list[str]:
    """The job's acceptable types (in preference order) whose memory meets its floor."""
    return eligible_types(list(job.gpu_types), job.gpu_memory_gb)


def hold_seconds(job: Job) -> int:
    """`pricing.held_seconds` of the job: its max wall, or its org's hold window (renewed as the
    job runs) when shorter."""
    return held_seconds(job.max_wall_seconds, job.org.hold_window_seconds)


def run_estimate(job: Job, rate: int) -> int:
    """The job's `estimate`: its whole max wall time on its GPUs at `rate` (the price its hold is
    priced at), also when the hold covers only the org's hold window of it."""
    return cost(job.max_wall_seconds * 1000 * job.gpu_count, rate)


def price_job_hold(
    job: Job, gpu_types: list[str] | None = None, at: datetime | None = None, *, whole_run: bool = False
) -> int:
    """The job's hold at the highest current price among its eligible types; `whole_run`: its
    whole max wall time (its `estimate`) even when the hold covers only the org's hold window."""
    return hold_amount(
        gpu_types=gpu_types or eligible_gpu_types(job), gpu_count=job.gpu_count,
        seconds=job.max_wall_seconds if whole_run else hold_seconds(job), at=at,
    )


def place_job_hold(
    *, job: Job, key: str, types: list[str], amount: int, now: datetime, fresh: bool = False,
    audit_as: CallerEvent | None = None, actor: Any = None,
) -> Hold:
    """Lock and check every budget level, hold the funds, count the hold in the budgets.

    `fresh`: the hold cannot exist yet (its job was inserted by this same transaction), so the
    budget charges need no replay lookup, and the placement needs no savepoint (a refusal fails
    the submission); it also waits for a budget of the org being set (a requeue, which may hold
    other holds of the org, raises BudgetBeingSet instead: `budgets/scope_lock.py`). Lock order:
    the caller holds the job; budget periods (org, project, member) are locked here before
    `place_hold` locks buckets. Raises BudgetExceeded, BudgetBeingSet or InsufficientCredits.
    `audit_as`: the placement's audit event is the caller's (see `ledger.place_hold`). `types`
    come from the catalog (`eligible_types`): already checked. `actor`: the user whose request
    places the hold (a submission), recorded on soft-budget alerts; None (a requeue): the system.
    """
    prechecked = precheck_budgets(org=job.org, project=job.project, user=job.user, amount=amount, now=now,
                                  wait=fresh)
    hold = place_hold(
        org=job.org, amount=amount, key=key, project=job.project, user=job.user,
        gpu_types=types, reference=f"job:{job.pk}", actor=job.user, audit_as=audit_as,
        gpu_types_checked=True, savepoint=not fresh,
    )
    reserve_budgets(hold=hold, org=job.org, project=job.project, user=job.user, amount=amount,
                    prechecked=prechecked, fresh=fresh, actor=actor)
    return hold


def restriction_cuts(types: list[str], spendable: dict[tuple[str, ...], int]) -> list[list[str]]:
    """`types` (in preference order), then each subset of them that credits restricted to some GPU
    types could pay for (`types` narrowed to a restriction, or to several restrictions at once),
    best first: the one with the job's first-preferred type, then its second, and so on."""
    cuts = {tuple(types)}
    restrictions = [set(r) for r, total in spendable.items() if r and total > 0]
    frontier = {tuple(t for t in types if t in r) for r in restrictions} - {()}
    while frontier - cuts:
        new = frontier - cuts
        cuts |= new
        frontier = {tuple(t for t in cut if t in r) for cut in new for r in restrictions} - {()}
    return [list(cut) for cut in sorted(cuts, key=lambda cut: tuple(t not in cut for t in types))]


def restricted_refusal(
    short: InsufficientCredits, types: list[str], spendable: dict[tuple[str, ...], int], *, snap: Catalog,
    gpu_count: int, regions: tuple[str, ...], org_id: int, project_id: int, memory_gb: int = 0,
) -> InsufficientCredits:
    """The refusal of a hold for `types` when credits restricted to other GPU types exist: it says
    so, instead of "only 0.00 available" beside a balance that shows them (QA). It suggests only
    types those credits pay for that could ever run the job (review: it suggested a type with no
    node in the job's regions, or below its per-GPU memory floor, which the submission then
    refused 400), or none."""
    wanted = set(types)
    other = {r: total for r, total in spendable.items() if r and total > 0 and not wanted <= set(r)}
    if not other:
        return short

    def runnable(names: list[str]) -> list[str]:
        return [t for t in names if snap.memory_gb.get(t, 0) >= memory_gb
                and _never_on(snap, t, gpu_count, regions, org_id, project_id) is None]

    listed = "; ".join(f"{format_credits(total)} to {', '.join(r)}" for r, total in sorted(other.items()))
    # The job's own types those credits pay for were tried already (`hold_choices`): they are too
    # few for it there (QA: it was told to submit with the types it had asked for). Other types
    # are a suggestion.
    own = runnable([t for t in types if any(t in r for r in other)])
    elsewhere = [] if own else runnable(sorted({t for r in other for t in r}))
    suggestion = (f"; those for {', '.join(own)} are too few for it" if own
                  else f", e.g. gpu_types {json.dumps(elsewhere)}" if elsewhere
                  else "; none of those types could run it (its size, regions or quotas)")
    detail = (
        f"Needs {format_credits(short.needed)} credits for GPU types {', '.join(types)}, only "
        f"{format_credits(short.available)} available for them; the org's other "
        f"{format_credits(sum(other.values()))} available credits are restricted to certain GPU types "
        f"({listed}) and cannot pay for this job: they hold only for jobs that run on types they pay "
        f"for{suggestion}."
    )
    return InsufficientCredits(
        needed=short.needed, available=short.available, detail=detail,
        restricted=[{"gpu_types": list(r), "available": total} for r, total in sorted(other.items())],
    )


def hold_choices(
    *, snap: Catalog, types: list[str], gpu_count: int, regions: tuple[str, ...], org_id: int,
    project_id: int, seconds: int, at: datetime, spendable: dict[tuple[str, ...], int],
) -> list[tuple[list[str], Quote]]:
    """The holds a job accepting `types` may be given, best first, as submission and requeue both
    choose them (docs/api.md): each subset of `types` (`restriction_cuts`: all of them first, then
    those credits restricted to GPU types pay for, by preference) priced at its dearest type that
    could run the job, that the org's `spendable` credits could pay for. A narrower subset only
    when it could run the job. A hold for a subset draws only on buckets that pay for every type in
    it, and the job runs only on them. The placement locks and re-checks (`spendable` is unlocked)."""
    choices: list[tuple[list[str], Quote]] = []
    for cut in restriction_cuts(types, spendable):
        if cut != types and why_never_runs(snap, cut, gpu_count, regions, org_id, project_id) is not None:
            continue
        priced = runnable_types(snap, cut, gpu_count, regions, org_id, project_id)
        quote = hold_quote(gpu_types=priced, gpu_count=gpu_count, seconds=seconds, at=at)
        if funds_for(spendable, cut) >= quote.amount:
            choices.append((cut, quote))
    return choices


def price_tiers(types: list[str], at: datetime) -> list[list[str]]:
    """`types` and, after them, those below each lower price level: [[H100, A100, L4], [A100, L4],
    [L4]] for three prices. A hold priced at a tier pays for every type in it."""
    prices = current_prices(types, at)
    levels = sorted(set(prices.values()), reverse=True)
    return [[t for t in types if prices.get(t, 0) <= level] for level in levels] or [types]


@transaction.atomic(savepoint=False)
def reserve_job_hold(*, job: Job, key: str, actor: Any = None) -> tuple[Hold, list[str]]:
    """Price the job's hold, check every budget level, then hold the funds; idempotent by key.
    Returns the hold and the types it was priced over. `actor`: the user whose request funds it (a
    release), named by a crossed soft budget's alert; None for the system (a requeue, a retry).

    The hold is priced at the dearest type that could run the job; when the funds or a budget
    refuse that, at the next cheaper price level, and so on (review: a job accepted at A100's
    price, requeued once an H100 node had appeared in its region, was priced at H100's, refused,
    and waited `budget` for ever with A100 free). The scheduler tops a hold up before placing a
    job on a dearer type, or runs it on the types the hold covers. The types held for are chosen
    first as a submission chooses them (`hold_choices`: all its types, or when the credits for
    those fall short, the best subset of them that credits restricted to GPU types pay for; the
    hold then covers, and the job runs on, only that subset); only then the lower price levels.

    Lock order: the caller holds the job; budget periods (org, project, member) are locked and
    checked here before `place_hold` locks buckets. Raises BudgetExceeded or InsufficientCredits
    (for the cheapest level), or BudgetBeingSet.
    """
    existing = Hold.objects.filter(org_id=job.org_id, key=key).first()
    if existing is not None:
        return existing, list(existing.gpu_types)
    now = db_now()
    types = eligible_gpu_types(job)
    snap, regions = catalog(), tuple(job.regions)
    where = {"snap": snap, "gpu_count": job.gpu_count, "regions": regions, "org_id": job.org_id,
             "project_id": job.project_id}
    spendable = spendable_by_gpu_types(org_id=job.org_id, project_id=job.project_id, now=now)
    # First as the submission chooses (`hold_choices`), then the lower price levels of each subset.
    attempts = [(cut, runnable_types(types=cut, **where)) for cut, _ in hold_choices(
        types=types, seconds=hold_seconds(job), at=now, spendable=spendable, **where)]
    for cut in restriction_cuts(types, spendable):
        if cut != types and why_never_runs(types=cut, **where):
            continue  # a narrower cut (credits restricted to some of its types) only when it could run
        attempts += [(cut, tier) for tier in price_tiers(runnable_types(types=cut, **where), now)]
    refusal: BudgetExceeded | InsufficientCredits | None = None
    tried: set[tuple[tuple[str, ...], int]] = set()
    for cut, tier in attempts:
        amount = price_job_hold(job, tier, at=now)
        if (tuple(cut), amount) in tried or (cut != types and funds_for(spendable, cut) < amount):
            continue
        tried.add((tuple(cut), amount))
        try:
            with transaction.atomic():  # a refused level leaves nothing behind
                return place_job_hold(job=job, key=key, types=cut, amount=amount, now=now, actor=actor), tier
        except (BudgetExceeded, InsufficientCredits) as error:
            if refusal is None or cut == types:
                refusal = error  # the full set's cheapest level's, as before
    assert refusal is not None  # the full set is always tried
    if isinstance(refusal, InsufficientCredits):
        raise restricted_refusal(refusal, types, spendable, memory_gb=job.gpu_memory_gb or 0, **where)
    raise refusal
