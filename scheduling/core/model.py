"""Plain data the scheduling core consumes: a snapshot of the fleet, the running and pending jobs.

Everything here is immutable and free of Django so that the same objects can be built by the DB
adapter (from one transaction's reads) and by the trace replay (from a simulated clock).
Ids are ints, times are float seconds on the caller's clock, money is int micro-credits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

NodeState = Literal["ready", "draining", "unknown", "down"]
Policy = Literal["fifo", "fifo_backfill", "fair"]
Allocation = tuple[tuple[int, tuple[int, ...]], ...]
"""((node_id, (gpu_index, ...)), ...): the exact GPUs of a gang, node by node."""


@dataclass(frozen=True, slots=True)
class GpuType:
    """A GPU model the fleet sells; price is per GPU-hour in micro-credits."""

    name: str
    memory_gb: int
    price_per_gpu_hour_micro: int


@dataclass(frozen=True, slots=True)
class Node:
    """A host with `gpu_count` GPUs of one type; only `ready` nodes receive new work."""

    id: int
    gpu_type: str
    gpu_count: int
    free_gpu_indices: frozenset[int]
    region: str = ""
    nvlink_domain: str = ""
    ib_group: str = ""
    state: NodeState = "ready"
    available_until: float | None = None
    """When its next maintenance window starts (Slurm's maintenance reservation), if one is set: a
    job may run on it only if it ends by then (by its max wall). None = no window ahead."""
    maintenance_ends: float | None = None
    """When its maintenance window (the one it is in, its `state` then `draining`, or the next one)
    ends, unless an operator's cordon or its health keeps it out anyway: named in "not ready now"
    notes, and for a node out of the pass (inside its window, or held out for one too close) the
    time from which an EASY reservation counts on its GPUs. None = no window, or no promise."""


@dataclass(frozen=True, slots=True)
class PriorityClass:
    """A priority tier. Higher `rank` wins; preemption only ever goes from a higher to a lower rank."""

    name: str
    rank: int
    preemptible_by_higher: bool
    """The class's policy: the default of its jobs' own `preemptible` flag, applied when a job is
    submitted without one. The core decides by the job's flag alone (one rule: a job of a
    non-preemptible class may volunteer), so changing this does not change jobs already queued."""
    can_preempt: bool


DEFAULT_PRIORITY_CLASSES: tuple[PriorityClass, ...] = (
    # The ladder: only production is non-preemptible by default. Same table as the DB default
    # (scheduling migration 0002); tests/scheduling/core/test_classes.py keeps them equal.
    PriorityClass("production", 5, preemptible_by_higher=False, can_preempt=True),
    PriorityClass("premium", 4, preemptible_by_higher=True, can_preempt=True),
    PriorityClass("standard", 3, preemptible_by_higher=True, can_preempt=True),
    PriorityClass("batch", 2, preemptible_by_higher=True, can_preempt=False),
    PriorityClass("interactive", 1, preemptible_by_higher=True, can_preempt=False),
)


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A queued job (or a preempted one queued again) asking for a gang of `gpu_count` GPUs."""

    id: int
    org_id: int
    project_id: int
    user_id: int
    priority_class: str
    gpu_count: int
    max_wall_seconds: float
    submitted_at: float
    gpu_types: tuple[str, ...] = ()
    """Acceptable GPU types in order of preference; empty means any type (cheapest first)."""
    gpu_memory_gb: int = 0
    """Per-GPU memory floor: types with less memory are never considered."""
    preemptible: bool = True
    """Whether a higher class may preempt it once it runs: the job's own flag, which is what the
    core reads (set it from the class's `preemptible_by_higher` when the client did not choose)."""
    regions: tuple[str, ...] = ()
    """Acceptable regions; empty means any."""
    budget_ok: bool = True
    """False when the ledger could not fund the hold; the job waits with reason `budget`."""
    max_wall_by_type: tuple[tuple[str, float], ...] = ()
    """Optional per-type wall limit (a slow type needs longer); falls back to `max_wall_seconds`."""
    run_seconds: float = 0.0
    """Seconds this job already ran in earlier attempts (a preempted job queued again). Aging counts
    time spent waiting, so this is subtracted from the time since submission."""
    max_price: int | None = None
    """Per-GPU-hour price (micro-credits) above which the job is not placed this pass: set while a
    top-up of its hold for a dearer type stands refused, so it runs on the types its hold covers
    meanwhile instead of waiting for funds. None: no cap."""

    def wall_on(self, gpu_type: str) -> float:
        for name, seconds in self.max_wall_by_type:
            if name == gpu_type:
                return seconds
        return self.max_wall_seconds


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job attempt holding GPUs; `preemption_requested_at` is set once it has been signalled."""

    id: int
    attempt_id: int
    org_id: int
    project_id: int
    user_id: int
    priority_class: str
    preemptible: bool
    """The job's own flag, as on `PendingJob`: the only thing that makes it a candidate victim."""
    gpu_type: str
    allocations: Allocation
    started_at: float
    max_wall_seconds: float
    preemption_requested_at: float | None = None
    submitted_at: float | None = None
    """Original submission time; a preempted job re-queues with it (defaults to `started_at`)."""
    prior_run_seconds: float = 0.0
    """Seconds the job ran in attempts before this one (not waiting, so not aged)."""
    times_preempted: int = 0
    """Earlier attempts of this job that ended in preemption (see `preemption_exempt_growth`)."""
    gpu_types: tuple[str, ...] = ()
    """The request it would be queued again with, as on `PendingJob`: acceptable types in order of
    preference (empty: any type, cheapest first), the per-GPU memory floor and per-type walls
    (empty: `max_wall_seconds` on every type). The victim rule orders a victim as the queue would."""
    gpu_memory_gb: int = 0
    max_wall_by_type: tuple[tuple[str, float], ...] = ()
    stop_grace_seconds: float | None = None
    """The grace its stop gave it (signal, then kill) once signalled: a cancellation's, a time-out's
    or an out-of-credit stop's may differ from a preemption's. None: `Config.grace_seconds`."""
    gpu_count: int = field(init=False, repr=False, compare=False)
    """Derived from `allocations` once: it is read in every pass for every running job."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpu_count", sum(len(idx) for _, idx in self.allocations))

    def ends_by(self, grace_seconds: float) -> float:
        """When it frees its GPUs at the latest (possibly past): its max wall time or, once
        signalled, the end of its stop's grace (`stop_grace_seconds`, else `grace_seconds`)."""
        end = self.started_at + self.max_wall_seconds
        if self.preemption_requested_at is not None:
            grace = grace_seconds if self.stop_grace_seconds is None else self.stop_grace_seconds
            end = min(end, self.preemption_requested_at + grace)
        return end


@dataclass(frozen=True, slots=True)
class Usage:
    """Decayed GPU-seconds per org, per project and per (project, user) association."""

    org: Mapping[int, float] = field(default_factory=dict)
    project: Mapping[int, float] = field(default_factory=dict)
    user: Mapping[tuple[int, int], float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Shares:
    """Fair-share weights (Slurm "shares"); a missing entry counts as 1.0."""

    org: Mapping[int, float] = field(default_factory=dict)
    project: Mapping[int, float] = field(default_factory=dict)
    user: Mapping[tuple[int, int], float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Quotas:
    """Max concurrent GPUs per (org, gpu type) and per (project, gpu type); absent = unlimited."""

    org: Mapping[tuple[int, str], int] = field(default_factory=dict)
    project: Mapping[tuple[int, str], int] = field(default_factory=dict)


END_TIME_PACKING: tuple[str, ...] = ("off", "tightest", "partial")


@dataclass(frozen=True, slots=True)
class Config:
    """Policy knobs. Weights are in units of one priority-class step (see docs/scheduler.md)."""

    policy: Policy = "fair"
    priority_classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
    fairshare_half_life_seconds: float = 7 * 24 * 3600.0
    fairshare_weight: float = 0.3
    size_weight: float = 0.65
    """Weight of the small-request factor (requested wall time), Slurm's job-size factor."""
    size_gpu_exponent: float = 0.0
    """The size factor reads wall x gpus ** this: 0 = wall time only, 1 = GPU-hours."""
    aging_seconds_per_class: float = 7 * 24 * 3600.0
    """Waiting this long is worth one priority-class step; uncapped so nothing starves."""
    aging_grace_wall_factor: float = 0.0
    """A job starts aging only after waiting this x its requested wall time (slack proportional to
    size, as a deadline of submit + k x wall): short jobs age at once, long ones later, so the
    size factor is not washed out by deep queues. 0 = every job ages from submission."""
    response_ratio_weight: float = 0.0
    """Weight of log2 of the job's response ratio, 1 + wait / max(wall, response_ratio_floor_seconds)
    (HRRN-like aging relative to the job's size: a short job gains a class step after waiting a few
    times its wall, a long one only after waiting many times its length). 0 = off."""
    response_ratio_floor_seconds: float = 600.0
    """Walls shorter than this count as this long in the response ratio (bounded slowdown's floor)."""
    slow_type_wait_factor: float = 0.5
    """Fair policy: a job waits for a faster acceptable type for up to this x the extra run time
    a slower type would cost (ski rental); 0 = always take the first type that fits."""
    backfill: bool = True
    max_reservations: int = 3
    """EASY reservations per pass, at most one per GPU type: the top blocked job of each of up to
    this many types is protected from backfill (1, EASY's own, left a blocked T4 job unprotected
    whenever an H100 job held the one reservation: QA, session 12). Measured: docs/scheduler.md
    "Reservations per type"."""
    backfill_max_candidates: int = 20_000
    """Jobs examined after the first blocked one; the rest wait with reason `priority`."""
    preemption: bool = True
    min_runtime_before_preemption_seconds: float = 600.0
    preemption_exempt_growth: float = 2.0
    """A job preempted k times before is exempt for min_runtime x this ** k of its new attempt
    (k counted from `preemption_exempt_after`): > 1 stops a stream of different preemptors taking
    turns on one long victim (each waits only the minimum runtime, so the victim could be stopped
    every 600 s forever). 1 = off. Default 2 since ADR 0007."""
    preemption_exempt_after: int = 5
    """Growth starts only after this many earlier preemptions: a job preempted k times before is
    exempt for min_runtime x growth ** max(0, k - this). Jobs preempted a few times keep the plain
    minimum runtime; only repeatedly stopped ones get longer. 0 = grow from the first preemption.
    Default 5 since ADR 0007 (a job's first six attempts: 600 s; its 7th 20 min, its 10th 2 h 40 min)."""
    grace_seconds: float = 120.0
    max_preemption_attempts: int = 64
    """Blocked jobs per pass allowed to search for victims, bounding the pass's cost."""
    preemption_min_gain: float = 1.0
    """A victim not yet signalled must have at least this x the preemptor's run time (max wall on
    the type) left before its own wall limit: preempt only to run something shorter than what is
    stopped (SRPT). 0 = no such rule. Default 1 since ADR 0005."""
    max_preemptions_per_pass: int = 1_000_000
    """Newly signalled victims per pass; later blocked jobs wait for GPUs to free normally."""
    end_time_packing: str = "off"
    """Single-node placement by expected end time (long jobs beside long ones, so whole nodes
    drain): a node's end is the latest `started_at + max_wall_seconds` of its jobs, a placed job's
    is now + its wall on the type. "off" = tightest fit only; "tightest" = among the nodes of the
    tightest-fitting free count, the one whose end is closest to the job's; "partial" = among all
    fitting nodes that already run something, closest end first, tightest fit on ties (an idle
    node only when no busy node fits, tightest first). Multi-node gangs are unaffected."""

    def __post_init__(self) -> None:
        if not self.preemption_exempt_growth >= 1.0:  # also rejects NaN
            raise ValueError(
                f"preemption_exempt_growth must be >= 1 (1 = off), got {self.preemption_exempt_growth!r}: "
                "below 1 a preempted job would be exempt for less than the minimum runtime"
            )
        if not (isinstance(self.preemption_exempt_after, int) and self.preemption_exempt_after >= 0):
            raise ValueError(
                f"preemption_exempt_after must be an int >= 0, got {self.preemption_exempt_after!r}"
            )
        if self.end_time_packing not in END_TIME_PACKING:
            raise ValueError(
                f"end_time_packing must be one of {', '.join(END_TIME_PACKING)}, "
                f"got {self.end_time_packing!r}"
            )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling pass needs, read at one instant `now`."""

    now: float
    gpu_types: Mapping[str, GpuType]
    nodes: tuple[Node, ...]
    running: tuple[RunningJob, ...]
    pending: tuple[PendingJob, ...]
    usage: Usage = field(default_factory=Usage)
    shares: Shares = field(default_factory=Shares)
    quotas: Quotas = field(default_factory=Quotas)
    config: Config = field(default_factory=Config)
