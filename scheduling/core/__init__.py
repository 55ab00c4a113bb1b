"""Pure scheduling core: `schedule(Snapshot) -> Result`. No Django, no I/O, no clock.

See docs/scheduler.md for the policy, the reason codes and how an adapter applies decisions.
"""

from scheduling.core.decisions import Decision, Place, Preempt, Reservation, Result, Skip
from scheduling.core.fairshare import (
    DecayingUsage,
    Level,
    PriorityTerms,
    fair_tree_factors,
    job_priority,
    size_factor,
)
from scheduling.core.model import (
    DEFAULT_PRIORITY_CLASSES,
    Allocation,
    Config,
    GpuType,
    Node,
    PendingJob,
    PriorityClass,
    Quotas,
    RunningJob,
    Shares,
    Snapshot,
    Usage,
)
from scheduling.core.scheduler import queue_order, schedule
from scheduling.core.standing import Standing

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "Allocation",
    "Config",
    "DecayingUsage",
    "Decision",
    "GpuType",
    "Level",
    "Node",
    "PendingJob",
    "Place",
    "Preempt",
    "PriorityClass",
    "PriorityTerms",
    "Quotas",
    "Reservation",
    "Result",
    "RunningJob",
    "Shares",
    "Skip",
    "Snapshot",
    "Standing",
    "Usage",
    "fair_tree_factors",
    "job_priority",
    "queue_order",
    "schedule",
    "size_factor",
]
