"""Fair share (Slurm Fair Tree-like) and the multifactor job priority built on it.

Fair Tree: at each level (orgs, then projects inside an org, then users inside a project) siblings are
ranked by level fair share LF = S/U (normalised share over normalised decayed usage among siblings).
Users are then ordered depth-first, i.e. lexicographically by (LF_org, LF_project, LF_user), and the
fair-share factor of a user is its rank / n in (0, 1]; 1 = most under-served. Equal paths share a rank,
so two idle orgs are never ordered by their ids.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from scheduling.core.model import Config, PendingJob, Shares, Usage

K = TypeVar("K", bound=Hashable)

UserKey = tuple[int, int, int]
"""(org_id, project_id, user_id): one association in the tree."""


class Level(NamedTuple):
    """One level of a job's path in the tree, among its siblings: normalised share and usage."""

    share: float  # this member's share / the siblings' total (default weight 1 each)
    usage: float  # this member's decayed usage / the siblings' total (0 when none used any)

    @property
    def fair_share(self) -> float:
        """LF = S / U; no usage at all is infinitely under-served, a zero share with usage the
        opposite."""
        return math.inf if self.usage == 0.0 else self.share / self.usage


def _levels(members: Iterable[K], usage: Mapping[K, float], shares: Mapping[K, float]) -> dict[K, Level]:
    ids = list(members)
    total_share = sum(max(shares.get(i, 1.0), 0.0) for i in ids) or 1.0
    total_usage = sum(max(usage.get(i, 0.0), 0.0) for i in ids)
    return {
        i: Level(
            max(shares.get(i, 1.0), 0.0) / total_share,
            max(usage.get(i, 0.0), 0.0) / total_usage if total_usage > 0 else 0.0,
        )
        for i in ids
    }


Path = tuple[Level, Level, Level]
"""An association's org, project and user levels, in that order."""


def tree_levels(users: Iterable[UserKey], usage: Usage, shares: Shares) -> dict[UserKey, Path]:
    """Each association's levels among its siblings: orgs, then its org's projects, then its
    project's users (only those in `users` count as siblings)."""
    tree: dict[int, dict[int, set[int]]] = defaultdict(lambda: defaultdict(set))
    for org, project, user in users:
        tree[org][project].add(user)
    paths: dict[UserKey, Path] = {}
    org_levels = _levels(tree.keys(), usage.org, shares.org)
    for org, projects in tree.items():
        project_levels = _levels(projects.keys(), usage.project, shares.project)
        for project, members in projects.items():
            user_levels = _levels([(project, u) for u in members], usage.user, shares.user)
            for u in members:
                paths[(org, project, u)] = org_levels[org], project_levels[project], user_levels[(project, u)]
    return paths


def fair_tree_factors(users: Iterable[UserKey], usage: Usage, shares: Shares) -> dict[UserKey, float]:
    """Fair-share factor per association, in (0, 1]; higher means more under-served."""
    keys = {
        k: (org.fair_share, project.fair_share, user.fair_share)
        for k, (org, project, user) in tree_levels(users, usage, shares).items()
    }
    ordered = sorted(keys, key=lambda k: keys[k], reverse=True)
    n = len(ordered)
    factors: dict[UserKey, float] = {}
    rank = n
    prev: tuple[float, float, float] | None = None
    for pos, k in enumerate(ordered):
        if keys[k] != prev:
            rank = n - pos
            prev = keys[k]
        factors[k] = rank / n
    return factors


def size_factor(gpu_count: int, wall_seconds: float, gpu_exponent: float = 0.0) -> float:
    """Short requests score near 1, long ones near 0: `1 / (1 + log2(1 + hours))`, where
    hours = requested wall hours x gpu_count ** gpu_exponent.

    The default exponent 0 is shortest-job-first on the *requested wall time* alone: on the Philly
    tuning window, counting GPUs as well (exponent 1, GPU-hours) left short 8- and 32-GPU gangs
    waiting many times their run time for no gain in average JCT.
    """
    hours = max(wall_seconds, 0.0) / 3600.0
    if gpu_exponent:
        hours *= max(gpu_count, 1) ** gpu_exponent
    return 1.0 / (1.0 + math.log2(1.0 + hours))


def job_priority(
    job: PendingJob, now: float, class_rank: int, fs: float, config: Config, wall: float
) -> float:
    """Multifactor priority in class steps: class rank + fair share + size + uncapped aging.

    fairshare_weight + size_weight < 1 keeps classes strictly ordered for fresh jobs; aging grows
    without bound so any job eventually outranks a stream of newer, higher-class or under-share jobs.
    """
    waited = max(now - job.submitted_at - job.run_seconds, 0.0)
    return priority_value(class_rank, fs, job.gpu_count, wall, waited, config)


class PriorityTerms(NamedTuple):
    """The priority's terms, in class steps (Slurm's `sprio`): their sum, in this order, is it."""

    class_rank: float
    fair_share: float  # fairshare_weight x the fair-share factor
    size: float  # size_weight x the size factor
    age: float  # waited beyond the aging grace, in classes (aging_seconds_per_class per step)
    response_ratio: float  # 0 unless response-ratio aging is on


def priority_terms(
    class_rank: int, fs: float, gpu_count: int, wall: float, waited: float, config: Config
) -> PriorityTerms:
    rr = 0.0
    if config.response_ratio_weight and waited > 0:
        ratio = 1.0 + waited / max(wall, config.response_ratio_floor_seconds)
        rr = config.response_ratio_weight * math.log2(ratio)
    return PriorityTerms(
        class_rank,
        config.fairshare_weight * fs,
        config.size_weight * size_factor(gpu_count, wall, config.size_gpu_exponent),
        max(waited - config.aging_grace_wall_factor * wall, 0.0) / config.aging_seconds_per_class,
        rr,
    )


def priority_value(
    class_rank: int, fs: float, gpu_count: int, wall: float, waited: float, config: Config
) -> float:
    """The priority formula itself, shared by queued jobs and by running jobs as if re-queued.

    Written out rather than `sum(priority_terms(...))`, which costs twice as much in the hot loop;
    a property test checks the two agree exactly.
    """
    value = (
        class_rank
        + config.fairshare_weight * fs
        + config.size_weight * size_factor(gpu_count, wall, config.size_gpu_exponent)
        + max(waited - config.aging_grace_wall_factor * wall, 0.0) / config.aging_seconds_per_class
    )
    if config.response_ratio_weight and waited > 0:
        ratio = 1.0 + waited / max(wall, config.response_ratio_floor_seconds)
        value += config.response_ratio_weight * math.log2(ratio)
    return value


@dataclass(slots=True)
class DecayingUsage:
    """Exponentially decayed GPU-seconds per key, updated lazily (for replays and adapters alike)."""

    half_life_seconds: float
    _values: dict[object, tuple[float, float]] = field(default_factory=dict)

    def _decay(self, value: float, since: float, now: float) -> float:
        if now <= since:
            return value
        return value * 0.5 ** ((now - since) / self.half_life_seconds)

    def add(self, key: object, gpu_seconds: float, now: float) -> None:
        value, since = self._values.get(key, (0.0, now))
        self._values[key] = (self._decay(value, since, now) + gpu_seconds, now)

    def value(self, key: object, now: float) -> float:
        value, since = self._values.get(key, (0.0, now))
        return self._decay(value, since, now)

    def values_at(self, now: float) -> dict[object, float]:
        """Every key's decayed value at `now` (what an adapter would put in a Usage)."""
        return {k: self._decay(v, since, now) for k, (v, since) in self._values.items()}
