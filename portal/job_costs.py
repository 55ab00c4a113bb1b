"""What one job cost, for its page: per attempt what its hold captured, the job's total, what
finance refunded, and where its current hold stands. Reshapes the reads of
`scheduling.job_reads.job_detail` (no query of its own but the hold's release split)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ledger.selectors import release_split
from portal.charts import Segment, stacked_bar
from scheduling.models import Job, JobAttempt


@dataclass(frozen=True)
class AttemptRow:
    attempt: JobAttempt
    nodes: list[str]
    charged: int
    gpu_hours: float | None  # what the charge paid for at the attempt's fixed rate; None at a rate of 0
    ran_for: timedelta | None


@dataclass(frozen=True)
class HoldRow:
    authorized: int
    captured: int
    returned: int  # released back to the buckets it came from
    expired: int  # released after its bucket expired: not given back
    remaining: int
    segments: list[Segment]


def _attempt_row(attempt: JobAttempt) -> AttemptRow:
    charged = attempt.hold.captured
    ran_for = None
    if attempt.started_at is not None and attempt.ended_at is not None:
        ran_for = attempt.ended_at - attempt.started_at
    rate = attempt.rate_per_gpu_hour
    return AttemptRow(attempt=attempt, nodes=sorted({a.node.name for a in attempt.allocations.all()}),
                      charged=charged, gpu_hours=charged / rate if rate else None, ran_for=ran_for)


def _hold_row(job: Job) -> HoldRow | None:
    hold = job.current_hold
    if hold is None:
        return None
    returned, expired = release_split(hold)
    return HoldRow(
        authorized=hold.authorized, captured=hold.captured, returned=returned, expired=expired,
        remaining=hold.remaining,
        segments=stacked_bar([("spent", "Captured", hold.captured), ("held", "Still held", hold.remaining),
                              ("available", "Given back", returned), ("expired", "Released to expiry",
                                                                      expired)]),
    )


def job_costs(job: Job) -> dict[str, Any]:
    """The template's `attempts`, `charged`, `refunded`, `net` and `hold`."""
    attempts = [_attempt_row(attempt) for attempt in job.attempts.all()]
    # Attempts may share a hold (counted once), as `scheduling.selectors.job_charged` counts them.
    charged = sum({row.attempt.hold_id: row.charged for row in attempts}.values())
    refunded = int(getattr(job, "refunded_total", 0))
    return {"attempts": attempts, "charged": charged, "refunded": refunded, "net": charged - refunded,
            "hold": _hold_row(job)}
