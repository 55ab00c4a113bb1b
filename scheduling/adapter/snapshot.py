"""Load a core `Snapshot` from the database: one query per table, no per-job queries.

Times become float seconds since the epoch (the core's clock); `now` is the database clock.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, TruncHour

from accounts.models import Membership, Organization, Project
from ledger.models import HoldState
from scheduling import core
from scheduling.grants import class_not_granted, not_granted_detail
from scheduling.models import (
    RAN_SINCE_RELEASE,
    Allocation,
    AttemptState,
    GpuPrice,
    GpuType,
    Job,
    JobAttempt,
    JobState,
    Node,
    PriorityClass,
    Quota,
    scheduling_state,
    scheduling_state_at,
)
from scheduling.pricing import covered_rate, held_gpu_ms
from scheduling.services import dependencies

LIVE = (AttemptState.SCHEDULED, AttemptState.RUNNING, AttemptState.STOPPING)
# Usage older than this many half-lives weighs < 1/32 and is left out of the aggregate.
USAGE_WINDOW_HALF_LIVES = 5


@dataclass(frozen=True, slots=True)
class PendingRow:
    """What the writer needs of a pending job besides what the core saw."""

    org_id: int
    project_id: int
    user_id: int
    hold_id: int | None
    attempt_count: int
    gpu_count: int
    max_wall_seconds: int
    hold_window_seconds: int | None
    wait_reason: str
    wait_detail: str
    gpu_types: tuple[str, ...] = ()
    hold_remaining: int = 0  # what the current hold still holds (authorized - captured - released)
    expected_start_at: datetime | None = None


@dataclass(slots=True)
class Loaded:
    """A snapshot plus the ids and prices the writer needs to apply its decisions."""

    snapshot: core.Snapshot
    now: datetime
    type_ids: dict[str, int]
    pending: dict[int, PendingRow]
    attempt_orgs: dict[int, int] = field(default_factory=dict)  # live attempt id -> org id
    not_granted: tuple[NotGranted, ...] = ()  # left out of the snapshot: see `not_granted_queued`


def epoch(value: datetime) -> float:
    return value.timestamp()


_CORE_DEFAULTS = core.Config()
"""Unset settings take the core's own defaults (one place to change them: `core.Config`)."""


def scheduler_config(classes: tuple[core.PriorityClass, ...]) -> core.Config:
    d = _CORE_DEFAULTS
    return core.Config(
        priority_classes=classes,
        fairshare_half_life_seconds=float(
            getattr(settings, "SCHEDULER_FAIRSHARE_HALF_LIFE_SECONDS", d.fairshare_half_life_seconds)
        ),
        grace_seconds=float(getattr(settings, "SCHEDULER_PREEMPT_GRACE_SECONDS", d.grace_seconds)),
        min_runtime_before_preemption_seconds=float(
            getattr(settings, "SCHEDULER_MIN_RUNTIME_SECONDS", d.min_runtime_before_preemption_seconds)
        ),
        preemption_exempt_growth=float(
            getattr(settings, "SCHEDULER_PREEMPT_EXEMPT_GROWTH", d.preemption_exempt_growth)
        ),
        preemption_exempt_after=int(
            getattr(settings, "SCHEDULER_PREEMPT_EXEMPT_AFTER", d.preemption_exempt_after)
        ),
        end_time_packing=str(getattr(settings, "SCHEDULER_END_TIME_PACKING", d.end_time_packing)),
        max_reservations=int(getattr(settings, "SCHEDULER_MAX_RESERVATIONS", d.max_reservations)),
    )


def load_gpu_types(now: datetime) -> tuple[dict[str, core.GpuType], dict[str, int]]:
    """GPU types with a current price (a type nobody has priced yet is not for sale)."""
    price = (
        GpuPrice.objects.filter(gpu_type=OuterRef("pk"), effective_from__lte=now)
        .order_by("-effective_from")
        .values("price_per_gpu_hour")[:1]
    )
    types: dict[str, core.GpuType] = {}
    ids: dict[str, int] = {}
    for type_id, name, memory, current in GpuType.objects.annotate(price=Subquery(price)).values_list(
        "id", "name", "memory_gb", "price"
    ):
        if current is not None:
            types[name] = core.GpuType(name, memory, int(current))
            ids[name] = type_id
    return types, ids


def load_usage(now: datetime, half_life: float) -> core.Usage:
    """Decayed GPU-seconds per org, project and (project, user): one aggregate by hour of use."""
    since = now - timedelta(seconds=half_life * USAGE_WINDOW_HALF_LIVES)
    when = Coalesce("ended_at", Value(now, output_field=DateTimeField()))
    rows = (
        JobAttempt.objects.filter(started_at__isnull=False)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gte=since))
        .annotate(hour=TruncHour(when))
        .values("org_id", "job__project_id", "job__user_id", "hour")
        .annotate(gpu_ms=Sum("usage__billable_gpu_ms"))
        .order_by()
    )
    org: dict[int, float] = defaultdict(float)
    project: dict[int, float] = defaultdict(float)
    user: dict[tuple[int, int], float] = defaultdict(float)
    now_s = epoch(now)
    for row in rows:
        if not row["gpu_ms"]:
            continue
        age = max(0.0, now_s - epoch(row["hour"]) - 1800.0)  # middle of the hour
        value = row["gpu_ms"] / 1000.0 * 0.5 ** (age / half_life)
        org[row["org_id"]] += value
        project[row["job__project_id"]] += value
        user[(row["job__project_id"], row["job__user_id"])] += value
    return core.Usage(org=dict(org), project=dict(project), user=dict(user))


def load_shares() -> core.Shares:
    """Only weights different from the default 1 (the core treats a missing entry as 1)."""
    return core.Shares(
        org=dict(Organization.objects.exclude(fair_share_weight=1).values_list("id", "fair_share_weight")),
        project=dict(Project.objects.exclude(fair_share_weight=1).values_list("id", "fair_share_weight")),
        user={
            (p, u): float(w)
            for p, u, w in Membership.objects.exclude(fair_share_weight=1).values_list(
                "project_id", "user_id", "fair_share_weight"
            )
        },
    )


def load_quotas() -> core.Quotas:
    org: dict[tuple[int, str], int] = {}
    project: dict[tuple[int, str], int] = {}
    for org_id, project_id, type_name, max_gpus in Quota.objects.values_list(
        "org_id", "project_id", "gpu_type__name", "max_gpus"
    ):
        if project_id is None:
            org[(org_id, type_name)] = max_gpus
        else:
            project[(project_id, type_name)] = max_gpus
    return core.Quotas(org=org, project=project)


@dataclass(frozen=True, slots=True)
class Earlier:
    """A job's attempts that have ended: seconds run (aging counts waiting, not running) and how
    many ended in preemption (each lengthens its exemption, `preemption_exempt_growth`)."""

    ran_seconds: float = 0.0
    preempted: int = 0


_NONE_BEFORE = Earlier()


def earlier_attempts(job_ids: Iterable[int]) -> dict[int, Earlier]:
    ids = list(job_ids)
    if not ids:
        return {}
    ran = ExpressionWrapper(F("ended_at") - F("started_at"), output_field=DurationField())
    rows = (
        JobAttempt.objects.filter(job_id__in=ids, ended_at__isnull=False)
        .values("job_id")
        .annotate(
            # Only runs since the job began to wait: its queue time starts at a release
            # (`aging_from`), and what it ran before that is no waiting to take back.
            ran=Sum(ran, filter=Q(started_at__isnull=False) & RAN_SINCE_RELEASE),
            preempted=Count("id", filter=Q(outcome="preempted")),
        )
        .order_by()
    )
    return {
        r["job_id"]: Earlier(r["ran"].total_seconds() if r["ran"] is not None else 0.0, r["preempted"])
        for r in rows
    }


def load_fleet(now: datetime) -> tuple[tuple[core.Node, ...], tuple[core.RunningJob, ...], dict[int, int]]:
    """Nodes with their free GPU indices, and the live attempts holding GPUs."""
    gpus_of: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    used: dict[int, set[int]] = defaultdict(set)
    for attempt_id, node_id, index in Allocation.objects.filter(released_at__isnull=True).values_list(
        "attempt_id", "node_id", "gpu_index"
    ):
        gpus_of[attempt_id][node_id].append(index)
        used[node_id].add(index)
    rows = Node.objects.values_list(
        "id", "gpu_type__name", "gpu_count", "region__code", "nvlink_domain", "ib_group", "state",
        "cordon", "maintenance_from", "maintenance_until",
    ).order_by("id")
    nodes = tuple(
        core.Node(
            id=node_id,
            gpu_type=type_name,
            gpu_count=count,
            free_gpu_indices=frozenset(range(count)) - used.get(node_id, set()),
            region=region,
            nvlink_domain=nvlink,
            ib_group=ib,
            state=scheduling_state_at(state, cordon, now, start, end),
            available_until=epoch(start) if start is not None and now < start else None,
            maintenance_ends=(
                epoch(end) if end is not None and now < end and scheduling_state(state, cordon) == "ready"
                else None
            ),
        )
        for node_id, type_name, count, region, nvlink, ib, state, cordon, start, end in rows
    )
    running: list[core.RunningJob] = []
    orgs: dict[int, int] = {}
    live = list(JobAttempt.objects.filter(state__in=LIVE).values_list(
        "id", "job_id", "org_id", "job__project_id", "job__user_id", "job__priority_class__name",
        "job__preemptible", "gpu_type__name", "started_at", "scheduled_at", "job__max_wall_seconds",
        "stop_requested_at", "grace_seconds", "job__submitted_at", "job__attempt_count",
        "job__aging_from", "job__dependency",
    ).order_by("id"))
    before = earlier_attempts(row[1] for row in live if row[-3] > 1)
    eligible_at = dependencies.last_ended(row[1] for row in live if row[-1])
    for row in live:
        (attempt_id, job_id, org_id, project_id, user_id, klass, preemptible, type_name,
         started, scheduled, wall, stop_at, grace, submitted, _attempts, aging_from, _dependency) = row
        eligible = max((t for t in (eligible_at.get(job_id), aging_from) if t), default=None)
        orgs[attempt_id] = org_id
        earlier = before.get(job_id, _NONE_BEFORE)
        running.append(
            core.RunningJob(
                id=job_id,
                attempt_id=attempt_id,
                org_id=org_id,
                project_id=project_id,
                user_id=user_id,
                priority_class=klass,
                preemptible=preemptible,
                gpu_type=type_name,
                allocations=tuple(
                    (node_id, tuple(sorted(idx))) for node_id, idx in sorted(gpus_of[attempt_id].items())
                ),
                started_at=epoch(started or scheduled),
                max_wall_seconds=float(wall),
                preemption_requested_at=epoch(stop_at) if stop_at else None,
                # the grace its stop gave it (a cancellation's 30 s, a preemption's 120 s, ...)
                stop_grace_seconds=float(grace) if stop_at and grace is not None else None,
                # The core's victim rule compares queue positions, i.e. submission times (or,
                # for a job with dependencies, when the last one ended, as in the queue).
                submitted_at=epoch(max(submitted, eligible) if eligible else submitted),
                prior_run_seconds=earlier.ran_seconds,
                times_preempted=earlier.preempted,
            )
        )
    return nodes, tuple(running), orgs


def _waiting_queued(now: datetime) -> QuerySet[Job]:
    """Queued, not held, past any retry backoff and funding retry."""
    return Job.objects.filter(state=JobState.QUEUED, held=False).filter(
        Q(not_before__isnull=True) | Q(not_before__lte=now)).filter(
        Q(funding_retry_at__isnull=True) | Q(funding_retry_at__lte=now))


def offered_queued(now: datetime) -> QuerySet[Job]:
    """Queued jobs a pass may be offered: not held, past any retry backoff and funding retry, their
    org still granted their class if it is restricted. Those with dependencies are offered only
    once they are met (`dependencies.unmet_among`, asked about them alone)."""
    return _waiting_queued(now).exclude(class_not_granted())


@dataclass(frozen=True, slots=True)
class NotGranted:
    """A queued job kept out of the pass because its org may no longer use its priority class."""

    job_id: int
    org_id: int
    detail: str
    wait_reason: str
    wait_detail: str


def not_granted_queued(now: datetime) -> tuple[NotGranted, ...]:
    """Queued jobs that would be offered but for their class (Slurm leaves a job whose QOS its
    association lost pending, never started): they wait, holding their credits, until the class
    is granted again or they are cancelled; running ones run on (review: a revoked `production`
    grant left the org's queued jobs preempting other orgs' work)."""
    rows = list(
        _waiting_queued(now).filter(class_not_granted())
        .values_list("id", "org_id", "org__name", "priority_class__name", "wait_reason", "wait_detail",
                     "dependency")
    )
    with_dependencies = [row[0] for row in rows if row[-1]]
    blocked = dependencies.unmet_among(with_dependencies) if with_dependencies else set()
    return tuple(
        NotGranted(job_id, org_id, not_granted_detail(klass, org), reason, detail)
        for job_id, org_id, org, klass, reason, detail, _dependency in rows if job_id not in blocked
    )


def load_pending(now: datetime) -> tuple[tuple[core.PendingJob, ...], dict[int, PendingRow]]:
    """Queued jobs whose backoff has passed, oldest first; budget_ok = an active hold backs them."""
    jobs: list[core.PendingJob] = []
    rows: dict[int, PendingRow] = {}
    queued = list(
        offered_queued(now)
        .values_list(
            "id", "org_id", "project_id", "user_id", "priority_class__name", "gpu_count",
            "max_wall_seconds", "submitted_at", "gpu_types", "gpu_memory_gb", "preemptible", "regions",
            "current_hold_id", "current_hold__state", "attempt_count", "wait_reason", "wait_detail",
            "org__hold_window_seconds", "current_hold__authorized", "current_hold__captured",
            "current_hold__released", "aging_from", "expected_start_at", "price_capped_until",
            "current_hold__gpu_types", "dependency",
        )
        .order_by("submitted_at", "id")
    )
    with_dependencies = [row[0] for row in queued if row[-1]]
    if with_dependencies:  # offered only once they are met (docs/api.md, "Dependencies")
        blocked = dependencies.unmet_among(with_dependencies)
        queued = [row for row in queued if row[0] not in blocked]
    before = earlier_attempts(row[0] for row in queued if row[14] > 0)  # attempt_count
    eligible_at = dependencies.last_ended(row[0] for row in queued if row[-1])
    for row in queued:
        (job_id, org_id, project_id, user_id, klass, gpus, wall, submitted, types, memory, preemptible,
         regions, hold_id, hold_state, attempts, wait_reason, wait_detail, window, authorized, captured,
         released, aging_from, expected_start_at, capped_until, hold_types, _dependency) = row
        if types and hold_types and hold_state == HoldState.ACTIVE:
            # Held on some of its types only (credits restricted to those): it runs only there.
            types = [name for name in types if name in hold_types] or types
        eligible = max((t for t in (eligible_at.get(job_id), aging_from) if t), default=None)
        remaining = (authorized or 0) - (captured or 0) - (released or 0)
        max_price = None
        if capped_until is not None and capped_until > now:  # a top-up was refused: see repricing
            max_price = covered_rate(remaining, held_gpu_ms(gpus, wall, window))
        jobs.append(
            core.PendingJob(
                id=job_id,
                org_id=org_id,
                project_id=project_id,
                user_id=user_id,
                priority_class=klass,
                gpu_count=gpus,
                max_wall_seconds=float(wall),
                # Aging starts when the job could first run: after its last dependency ended, or
                # when its user released it from a hold.
                submitted_at=epoch(max(submitted, eligible) if eligible else submitted),
                gpu_types=tuple(types or ()),
                gpu_memory_gb=memory,
                preemptible=preemptible,
                regions=tuple(regions or ()),
                budget_ok=hold_id is not None and hold_state == HoldState.ACTIVE,
                run_seconds=before.get(job_id, _NONE_BEFORE).ran_seconds,
                max_price=max_price,
            )
        )
        rows[job_id] = PendingRow(
            org_id, project_id, user_id, hold_id, attempts, gpus, wall, window, wait_reason, wait_detail,
            tuple(types or ()), remaining, expected_start_at,
        )
    return tuple(jobs), rows


def load_priority_classes() -> tuple[core.PriorityClass, ...]:
    """The classes as the core counts them: ranked 0, 1, 2, ... in the order of their stored ranks.

    The core's priority is in class steps (one class = 1, so aging lifts a job one class per
    `aging_seconds_per_class`); stored ranks are any increasing integers (the demo's are 100
    apart, which made a class step 100 units and aging 100 times slower than documented: QA)."""
    rows = PriorityClass.objects.order_by("rank").values_list("name", "rank", "preemptible", "can_preempt")
    return tuple(
        core.PriorityClass(name, step, preemptible_by_higher=preemptible, can_preempt=can_preempt)
        for step, (name, _rank, preemptible, can_preempt) in enumerate(rows)
    )


def load_snapshot(*, now: datetime, config: core.Config | None = None) -> Loaded:
    """Everything one pass needs, read in the caller's transaction."""
    if config is None:
        config = scheduler_config(load_priority_classes())
    gpu_types, type_ids = load_gpu_types(now)
    nodes, running, attempt_orgs = load_fleet(now)
    pending, rows = load_pending(now)
    snapshot = core.Snapshot(
        now=epoch(now),
        gpu_types=gpu_types,
        nodes=nodes,
        running=running,
        pending=pending,
        usage=load_usage(now, config.fairshare_half_life_seconds),
        shares=load_shares(),
        quotas=load_quotas(),
        config=config,
    )
    return Loaded(snapshot=snapshot, now=now, type_ids=type_ids, pending=rows, attempt_orgs=attempt_orgs,
                  not_granted=not_granted_queued(now))
