"""Stable reason codes written to audit events and shown to users for waiting jobs.

Codes are part of the API contract: add new ones, never rename.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from functools import lru_cache

PLACED = "placed"
BACKFILLED = "backfilled"
PREEMPTED_FOR_PRIORITY = "preempted-for-priority"
PREEMPTED_FOR_QUOTA = "preempted-for-quota"  # by a higher-class job of its own org/project at quota
DEPENDENCY_FAILED = "dependency-failed"  # end reason: an afterok dependency ended unsuccessfully

QUOTA = "quota"
RESOURCES = "resources"
PRIORITY = "priority"
BUDGET = "budget"
NO_MATCHING_GPU_TYPE = "no-matching-gpu-type"
WAITING_FOR_PREEMPTION = "waiting-for-preemption"
BACKOFF = "backoff"  # set by the lifecycle, not the core: requeued after a lost node, retry not before T
DEPENDENCY = "dependency"  # set at submission, not the core: waits for the jobs it depends on to end
HELD = "held"  # set by the lifecycle, not the core: held by its user until released
# set by the adapter, not the core: its org is no longer granted its restricted priority class (Slurm's
# pending reason when a job's QOS is taken from its association)
CLASS_NOT_GRANTED = "class-not-granted"
RESERVED_PREFIX = "reserved-for-job-"


def reserved_for(job_id: int) -> str:
    """`reserved-for-job-N`: the job fits, but only on GPUs reserved for a higher job N."""
    return f"{RESERVED_PREFIX}{job_id}"


WAIT_REASONS: frozenset[str] = frozenset(
    {QUOTA, RESOURCES, PRIORITY, BUDGET, NO_MATCHING_GPU_TYPE, WAITING_FOR_PREEMPTION, BACKOFF, DEPENDENCY,
     HELD, CLASS_NOT_GRANTED}
)


def is_wait_reason(code: str) -> bool:
    return code in WAIT_REASONS or code.startswith(RESERVED_PREFIX)


def utc_time(epoch_seconds: float) -> str:
    """A time in a wait detail: ISO 8601 UTC to the second, e.g. `2026-11-21T22:49:58Z`.

    Details are read by people and parsed by clients, so raw epoch seconds are no good and a zone-less
    local time is ambiguous; every time in a detail goes through here so they all read alike. Rounded
    up: each such time is a "not before" bound (earliest start, end of an exemption, retry), so the
    shown second is never earlier than the true instant.
    """
    return _utc_second(math.ceil(epoch_seconds))


@lru_cache(maxsize=4096)
def _utc_second(second: int) -> str:
    # Cached: passes write the same few times into many blocked jobs' details (the Alibaba replay:
    # ~57,000 calls, ~1,500 distinct seconds), and formatting costs ~3 us, ~20x a cache hit.
    return datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
