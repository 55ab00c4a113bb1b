"""Stable reason codes written to audit events and shown to users for waiting jobs.

Codes are part of the API contract: add new ones, never rename.
"""

from __future__ import annotations

PLACED = "placed"
BACKFILLED = "backfilled"
PREEMPTED_FOR_PRIORITY = "preempted-for-priority"
PREEMPTED_FOR_QUOTA = "preempted-for-quota"  # by a higher-class job of its own org/project at quota

QUOTA = "quota"
RESOURCES = "resources"
PRIORITY = "priority"
BUDGET = "budget"
NO_MATCHING_GPU_TYPE = "no-matching-gpu-type"
WAITING_FOR_PREEMPTION = "waiting-for-preemption"
RESERVED_PREFIX = "reserved-for-job-"


def reserved_for(job_id: int) -> str:
    """`reserved-for-job-N`: the job fits, but only on GPUs reserved for a higher job N."""
    return f"{RESERVED_PREFIX}{job_id}"


WAIT_REASONS: frozenset[str] = frozenset(
    {QUOTA, RESOURCES, PRIORITY, BUDGET, NO_MATCHING_GPU_TYPE, WAITING_FOR_PREEMPTION}
)


def is_wait_reason(code: str) -> bool:
    return code in WAIT_REASONS or code.startswith(RESERVED_PREFIX)
