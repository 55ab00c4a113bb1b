"""A queued job's place in the queue and what its priority is made of (Slurm's `sprio` and
`sshare` for one job), as `queue_order` computes it."""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.core.fairshare import Path, PriorityTerms


@dataclass(frozen=True, slots=True)
class Standing:
    job_id: int
    position: int  # 1 = the first job the next pass considers
    priority: float  # in class steps; the sum of `terms`
    terms: PriorityTerms
    fair_share_factor: float  # in (0, 1], 1 = the most under-served association
    levels: Path  # org, project, user: share and usage among their siblings
    wall_seconds: float  # the wall the size term reads (on the job's first acceptable type)
    waited_seconds: float  # what aging counts: time queued, runs excluded
