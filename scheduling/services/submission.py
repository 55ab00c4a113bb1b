"""Job submission: validate, create the job `queued`, reserve its hold — one transaction."""

import logging
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from django.conf import settings
from django.db import connection, models, transaction

from accounts.models import Project
from accounts.selectors import can_submit, job_write_refusal
from config import prepared
from config.clock import db_now
from config.errors import DomainError
from ledger.errors import InsufficientCredits
from ledger.models import Hold
from ledger.services import CallerEvent
from ledger.services.holds import funds_for, spendable_by_gpu_types
from scheduling.core import reasons
from scheduling.models import Dependency, Job, JobAttempt, JobState, PriorityClass, PriorityGrant
from scheduling.pricing import Catalog, PriorityInfo, Quote, catalog_knowing, hold_quote
from scheduling.services import dependencies
from scheduling.services.holding import held_detail
from scheduling.services.reservation import (
    check_can_ever_run,
    eligible_types,
    hold_choices,
    hold_seconds,
    place_job_hold,
    restricted_refusal,
    restriction_cuts,
    run_estimate,
    runnable_types,
)

logger = logging.getLogger(__name__)
_CURRENT_HOLD = Job._meta.get_field("current_hold").column
_SET_POINTER = f'UPDATE {Job._meta.db_table} SET "{_CURRENT_HOLD}" = %s WHERE id = %s'  # noqa: S608


class SubmissionInvalid(DomainError):
    """The spec names things that do not exist or breaks a policy (per-field `errors`)."""

    type = "validation-error"
    status = 400
    title = "Invalid job"

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("The job specification is invalid.", errors=errors)


class SubmissionForbidden(DomainError):
    type = "permission-denied"
    status = 403
    title = "Permission denied"


@dataclass(frozen=True, slots=True)
class JobSpec:
    """What a client asks for (already shape-checked by the API serializer)."""

    name: str
    gpu_types: tuple[str, ...]
    gpu_count: int
    max_wall_seconds: int
    priority_class: str
    gpu_memory_gb: int = 0
    preemptible: bool | None = None  # None: the priority class decides
    command: str = ""
    regions: tuple[str, ...] = field(default_factory=tuple)
    depends_on: tuple[int, ...] = ()  # earlier jobs of the same org that must end first
    dependency: str = Dependency.AFTER_OK  # how they must end (read only with `depends_on`)
    held: bool = False  # submitted held (Slurm's `sbatch --hold`): not scheduled until released


def _granted_since(cls: PriorityInfo, org_id: int) -> bool:
    """A grant the process's catalog does not know yet (made in another process within its TTL):
    one indexed read, and only before a refusal; a revoked grant is seen within the TTL."""
    return PriorityGrant.objects.filter(org_id=org_id, priority_class_id=cls.id).exists()


def validate_spec(spec: JobSpec, snap: Catalog, org_id: int) -> tuple[PriorityInfo, bool]:
    """Check names against the catalog snapshot (no queries unless a name is new to it), and that
    the submitting org may use the priority class."""
    errors: dict[str, list[str]] = {}
    if unknown := [name for name in spec.gpu_types if name not in snap.memory_gb]:
        errors["gpu_types"] = [f"Unknown GPU type {name!r}." for name in unknown]
    if len(set(spec.gpu_types)) != len(spec.gpu_types):
        errors.setdefault("gpu_types", []).append("GPU types must not repeat.")
    if missing := [code for code in spec.regions if code not in snap.regions]:
        errors["regions"] = [f"Unknown region {code!r}." for code in missing]
    if len(set(spec.regions)) != len(spec.regions):  # QA: accepted and stored, unlike gpu_types
        errors.setdefault("regions", []).append("Regions must not repeat.")
    cls = snap.priority_classes.get(spec.priority_class)
    preemptible = True
    if cls is None:
        errors["priority_class"] = [f"Unknown priority class {spec.priority_class!r}."]
    else:
        preemptible = cls.preemptible if spec.preemptible is None else spec.preemptible
        # Opting out of preemption is a privilege of non-preemptible classes (e.g. production):
        # otherwise any batch job could pin GPUs that higher classes are entitled to reclaim.
    if errors:
        raise SubmissionInvalid(errors)
    assert cls is not None
    if not cls.open_to(org_id) and not _granted_since(cls, org_id):
        raise SubmissionForbidden(
            f"Priority class {cls.name!r} is restricted to the organizations granted it, and yours "
            "has not been: ask your platform's operators, or choose another class.", field="priority_class",
        )
    if not preemptible and cls.preemptible:
        raise SubmissionForbidden(
            f"Priority class {cls.name!r} is preemptible; only jobs of a non-preemptible class "
            "(e.g. production) may opt out of preemption.", field="preemptible",
        )
    return cls, preemptible


# Field classes whose `get_db_prep_save` returns a value of exactly this Python type unchanged
# (`int(v)` / `str(v)` / `bool(v)` of it, or None when the field is nullable).
_PLAIN: dict[type, type] = {
    models.BigIntegerField: int, models.PositiveIntegerField: int, models.IntegerField: int,
    models.AutoField: int, models.BigAutoField: int,
    models.CharField: str, models.TextField: str, models.BooleanField: bool,
}


@cache
def _insert_sql() -> tuple[str, tuple[tuple[Any, str, type | None, bool], ...]]:
    fields = tuple(f for f in Job._meta.concrete_fields if not f.primary_key)
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(Job._meta.db_table)} ({', '.join(quote(f.column) for f in fields)}) "  # noqa: S608
        f"VALUES ({', '.join(['%s'] * len(fields))}) RETURNING {quote(Job._meta.pk.column)}"
    )
    plan = []
    for f in fields:
        target = f.target_field if f.is_relation else f
        plain = _PLAIN.get(type(target))
        # auto_now / auto_now_add fields compute their value in `pre_save`.
        computed = bool(getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False))
        plan.append((f, f.attname, None if computed else plain, f.null))
    return sql, tuple(plan)


def _insert(job: Job) -> None:
    """`job.save(force_insert=True)` as one precompiled, server-side prepared statement on
    PostgreSQL (the ORM's compilation of this insert cost more than the round trip, and
    PostgreSQL's planning of it more than running it). Same values: a plain int/str/bool (or
    None where allowed) goes as is, which is what its field's `get_db_prep_save` returns for
    it; anything else goes through `pre_save` and `get_db_prep_save`. Job has no save signal
    receivers or history."""
    if connection.vendor != "postgresql":
        job.save(force_insert=True)
        return
    sql, plan = _insert_sql()
    params = []
    for f, attname, plain, null in plan:
        value = job.__dict__.get(attname)
        if plain is None or not (type(value) is plain or (value is None and null)):
            value = f.get_db_prep_save(f.pre_save(job, True), connection)
        params.append(value)
    (job.pk,) = prepared.execute(sql, params)
    job._state.adding = False
    job._state.db = connection.alias


_last_trigger = 0.0  # monotonic time this process last asked for an early pass


def _schedule_soon() -> None:
    """Ask the scheduler for an early pass (after commit); never fails the submission.

    `schedule_soon` coalesces a burst with a cache key that lives SCHEDULER_SOON_COALESCE_SECONDS;
    while this process asked less than that long ago, a pass is pending (or just ran and the
    next submission's trigger will ask again), so the cache round trip is skipped.
    """
    global _last_trigger
    window = float(getattr(settings, "SCHEDULER_SOON_COALESCE_SECONDS", 1.0))
    now = time.monotonic()
    if now - _last_trigger < window:
        return
    _last_trigger = now
    try:
        from scheduling.tasks import schedule_soon
    except ImportError:
        return
    try:
        schedule_soon()
    except Exception:  # a lost trigger only delays placement until the next beat tick
        logger.warning("schedule_soon trigger failed", exc_info=True)


_PLACEMENT_ROUNDS = 3  # subsets tried at most (each once) before a submission is refused


def _place_submission_hold(
    *, job: Job, types: list[str], hold_types: list[str], quote: Quote, full_quote: Quote, now: datetime,
    spendable: dict[tuple[str, ...], int], where: dict[str, Any], event: CallerEvent,
    on_inserted: Callable[[Job], None] | None,
) -> Hold:
    """Place the submission's hold for `hold_types` at `quote`, chosen from the unlocked read
    `spendable` (`hold_choices`). A concurrent submission may spend the credits that read counted
    on before this one locks them (review: refused 402 while A100-restricted credits could pay);
    when the org has credits restricted to GPU types (another subset could pay), a refusal is then
    not final: the credits are read again (the locks have moved on) and the best subset not tried
    yet that they could pay for is tried, each at most once. Refused when none can: the 402 is
    about all of the job's types (and names the restricted credits, `restricted_refusal`)."""
    data = event.data
    tried = {tuple(hold_types)}
    refusal: InsufficientCredits | None = None
    for _ in range(_PLACEMENT_ROUNDS):
        if hold_types != types:  # held (and run) on these of its types only: the credits pay for no others
            data["hold_gpu_types"] = hold_types
        else:
            data.pop("hold_gpu_types", None)
        # Only another subset may pay when this one is refused: without one the refusal is final and
        # needs no savepoint (a refusal fails the submission).
        retry = len(restriction_cuts(types, spendable)) > 1
        try:
            with transaction.atomic() if retry else nullcontext():
                return place_job_hold(job=job, key=f"job:{job.pk}:submit", types=hold_types,
                                      amount=quote.amount, now=now, fresh=True, audit_as=event,
                                      actor=job.user)
        except InsufficientCredits as short:
            if hold_types == types:
                refusal = short
            if not retry:
                break
        spendable = spendable_by_gpu_types(org_id=job.org_id, project_id=job.project_id, now=now)
        untried = [(cut, priced) for cut, priced in hold_choices(
            types=types, seconds=hold_seconds(job), at=now, spendable=spendable, **where,
        ) if tuple(cut) not in tried]
        if not untried:
            break
        (hold_types, quote), tried = untried[0], tried | {tuple(untried[0][0])}
        job.estimate = run_estimate(job, quote.rate)  # the job row and the rendered body show it
        Job.objects.filter(pk=job.pk).update(estimate=job.estimate)
        if on_inserted is not None:
            on_inserted(job)
    if refusal is None:  # all its types were not tried under the locks: what the last read saw
        refusal = InsufficientCredits(needed=full_quote.amount, available=funds_for(spendable, types))
    raise restricted_refusal(refusal, types, spendable, memory_gb=job.gpu_memory_gb or 0, **where)


@transaction.atomic(savepoint=False)
def submit_job(
    *,
    user: Any,
    project: Project,
    spec: JobSpec,
    idempotency_key: str,
    on_inserted: Callable[[Job], None] | None = None,
    deferred_writes: list[tuple[str, list[Any]]] | None = None,
    now: datetime | None = None,
) -> Job:
    """Validate, create the job `queued`, price and place its hold (budgets + funds), audit.

    The API makes this exactly-once per (caller, Idempotency-Key) by committing its idempotency
    record in this same transaction; the key is also kept on the audit event.
    Raises SubmissionInvalid, SubmissionForbidden, BudgetExceeded or InsufficientCredits.

    Everything that touches no shared row (checks, pricing, the job insert) comes before the
    budget and bucket locks, so an organization's hot rows stay locked only for the ledger's
    writes, the job's hold pointer, the audit append and the commit. `on_inserted(job)` runs at
    that point too (the API renders the response body there, all but the hold).

    `deferred_writes`: instead of running it here, append the job's hold-pointer UPDATE
    (sql, params) for the caller to run later in its enclosing transaction (the API sends it
    with the idempotency record's completion, one round trip).

    `now`: the transaction's `now()` when the caller already read it (the API reads it with the
    idempotency claim), else it is read here.
    """
    if deferred_writes is not None and len(connection.atomic_blocks) < 2:
        raise ValueError("deferred_writes needs an enclosing transaction that runs them")
    if not can_submit(user, project):
        raise SubmissionForbidden(job_write_refusal(user, project, "submit"))
    snap = catalog_knowing(gpu_types=spec.gpu_types, priority_class=spec.priority_class,
                           regions=spec.regions)
    cls, preemptible = validate_spec(spec, snap, project.org_id)
    types = eligible_types(list(spec.gpu_types), spec.gpu_memory_gb, snap)
    check_can_ever_run(snap=snap, types=types, gpu_count=spec.gpu_count, regions=spec.regions,
                       org_id=project.org_id, project_id=project.pk)
    if now is None:
        now = db_now()
    job = Job(
        org_id=project.org_id, project=project, user=user, name=spec.name,
        gpu_types=list(spec.gpu_types), gpu_count=spec.gpu_count, gpu_memory_gb=spec.gpu_memory_gb,
        max_wall_seconds=spec.max_wall_seconds, priority_class_id=cls.id, preemptible=preemptible,
        command=spec.command, regions=list(spec.regions), state=JobState.QUEUED, submitted_at=now,
    )
    job.org = project.org
    priced = runnable_types(snap, types, spec.gpu_count, spec.regions, project.org_id, project.pk)
    quote = hold_quote(gpu_types=priced, gpu_count=spec.gpu_count, seconds=hold_seconds(job), at=now)
    # Credits restricted to some GPU types pay only for holds of jobs that run on those types: when
    # the credits for all of the job's types fall short, it is held (and runs) on the best subset
    # of them its credits can pay for (`hold_choices`, as a requeue chooses; one unlocked read, the
    # placement locks and re-checks).
    where = {"snap": snap, "gpu_count": spec.gpu_count, "regions": spec.regions, "org_id": project.org_id,
             "project_id": project.pk}
    spendable = spendable_by_gpu_types(org_id=project.org_id, project_id=project.pk, now=now)
    full_quote = quote
    choices = hold_choices(types=types, seconds=hold_seconds(job), at=now, spendable=spendable, **where)
    hold_types, quote = choices[0] if choices else (types, quote)  # none: the placement says how short
    job.estimate = run_estimate(job, quote.rate)
    after = dependencies.check(user=user, project=project, spec=spec) if spec.depends_on else None
    if after is not None:
        job.dependency = spec.dependency
        job.wait_reason, job.wait_detail = after.wait_reason, after.wait_detail
    if spec.held:  # shown before a dependency: releasing it shows the dependency again
        job.held, job.wait_reason, job.wait_detail = True, reasons.HELD, held_detail(user, None)
    _insert(job)
    if spec.held:  # the detail names the job's release route, known now (rare: held submissions only)
        job.wait_detail = held_detail(user, job.pk)
        Job.objects.filter(pk=job.pk).update(wait_detail=job.wait_detail)
    if after is not None:
        dependencies.record(job=job, depends_on=after.job_ids)
    # The serializer needs the class's name, and a new job has no attempts: no reads for them.
    job.priority_class = PriorityClass(id=cls.id, name=cls.name, preemptible=cls.preemptible)
    job._prefetched_objects_cache = {
        "attempts": JobAttempt.objects.none(), "depends_on": list(after.jobs) if after else [],
    }
    if on_inserted is not None:
        on_inserted(job)
    # One audit event for the submission and its hold: `sched.job.submit` carries the ledger
    # transaction (id, key, buckets) too, so the money movement stays audited in this transaction.
    data: dict[str, Any] = {"project": project.pk, "idempotency_key": idempotency_key[:255],
                            "gpu_types": list(spec.gpu_types), "gpu_count": spec.gpu_count}
    if spec.depends_on:
        data.update(depends_on=list(spec.depends_on), dependency=spec.dependency)
    if spec.held:
        data["held"] = True  # submitted held: the audit trail shows the hold a release later ends
    event = CallerEvent(
        action="sched.job.submit", subject_type="job", subject_id=job.pk, reason_code="submitted", data=data,
    )
    hold = _place_submission_hold(
        job=job, types=types, hold_types=hold_types, quote=quote, full_quote=full_quote, now=now,
        spendable=spendable, where=where, event=event, on_inserted=on_inserted,
    )
    pointer = (_SET_POINTER, [hold.pk, job.pk])
    if deferred_writes is not None:
        deferred_writes.append(pointer)
    else:
        with connection.cursor() as cursor:  # plain SQL: this runs while the org's rows are locked
            cursor.execute(*pointer)
    job.current_hold = hold
    transaction.on_commit(_schedule_soon)
    return job
