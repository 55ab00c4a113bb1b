"""What a scheduling pass returns. The adapter applies these in one transaction, in list order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from scheduling.core.model import Allocation


@dataclass(frozen=True, slots=True)
class Place:
    """Start `job_id` now on exactly these GPUs, billed at the type's current price for the run."""

    job_id: int
    gpu_type: str
    allocations: Allocation
    backfilled: bool
    reason_code: str
    rate_micro_per_gpu_hour: int
    max_wall_seconds: float


@dataclass(frozen=True, slots=True)
class Preempt:
    """Signal attempt `attempt_id` now; kill it after `grace_seconds`. Its GPUs free only on exit."""

    job_id: int
    attempt_id: int
    for_job_id: int
    grace_seconds: float
    reason_code: str


@dataclass(frozen=True, slots=True)
class Skip:
    """`job_id` stays queued this pass; `reason_code` is what the API shows as the wait reason."""

    job_id: int
    reason_code: str
    detail: str = ""


Decision = Place | Preempt | Skip


@dataclass(frozen=True, slots=True)
class Reservation:
    """GPUs promised to a blocked job from `start_at`; backfill never uses them past that time.
    A `quota` reservation promises no GPUs (`allocations` is empty): only the job's room under its
    concurrent-GPU quotas on the type, which later jobs of its org or project never take past then."""

    job_id: int
    gpu_type: str
    start_at: float
    allocations: Allocation
    kind: Literal["backfill", "preemption", "quota"]
    returning: bool = False
    """A `backfill` reservation all of whose GPUs are on nodes out of the pass until their
    maintenance window ends: it masks nothing (nothing is placed there before its start), so it
    takes neither its type's one EASY reservation nor one of the pass's `max_reservations`; its
    GPUs are promised to no other job of the pass. Its quota room is claimed as for any other."""


@dataclass(slots=True)
class Result:
    """All decisions of one pass, the reservations it made, and each pending job's wait reason."""

    decisions: list[Decision] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    wait_reasons: dict[int, str] = field(default_factory=dict)

    @property
    def reservation(self) -> Reservation | None:
        """The EASY-backfill reservation (top blocked job), if any: the first that holds its type's
        reservation (a `returning` one, on GPUs back from maintenance only, holds none)."""
        for r in self.reservations:
            if r.kind == "backfill" and not r.returning:
                return r
        return None

    @property
    def placements(self) -> list[Place]:
        return [d for d in self.decisions if isinstance(d, Place)]

    @property
    def preemptions(self) -> list[Preempt]:
        return [d for d in self.decisions if isinstance(d, Preempt)]

    @property
    def skips(self) -> list[Skip]:
        return [d for d in self.decisions if isinstance(d, Skip)]
