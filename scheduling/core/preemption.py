"""Victim selection: the cheapest set of lower-class running jobs whose exit lets a gang start.

Cost of a plan, compared lexicographically: fewest newly signalled victims, then the lowest highest
victim class, then the most over-share victims (lowest fair-share factor), then the fewest GPUs
stranded. Jobs already signalled (leaving anyway) are free to count on and are not signalled again;
their GPUs are claimed once, so two blocked jobs never count the same exiting GPUs.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from scheduling.core.model import Allocation, RunningJob
from scheduling.core.placement import FleetState, pick_in_group


@dataclass(frozen=True, slots=True)
class Plan:
    """Victims to signal (new) or count on (already signalled), and the gang's future GPUs."""

    victims: tuple[RunningJob, ...]
    allocations: Allocation
    cost: tuple[int, int, float, int]


class VictimIndex:
    """Running jobs that may be preempted, by node, for one pass."""

    def __init__(
        self,
        running: list[RunningJob],
        state: FleetState,
        rank_of: Callable[[str], int],
        fs_of: Callable[[RunningJob], float],
        prio_of: Callable[[RunningJob], float],
        now: float,
        min_runtime: float,
        exempt_growth: float = 1.0,
        exempt_after: int = 0,
    ) -> None:
        self.by_node: dict[int, list[RunningJob]] = defaultdict(list)
        self.rank: dict[int, int] = {}
        self.fs: dict[int, float] = {}
        self.prio: dict[int, float] = {}  # filled on first use: most candidates are never compared
        self._prio_of = prio_of
        self.claimed: set[int] = set()
        self.now = now
        # Failed single-node searches per (gpu type, regions): (rank, g, min_left, priority).
        self._failed: dict[tuple[str, tuple[str, ...]], list[tuple[int, int, float, float]]] = {}
        # Per GPU type, (victim rank, size of its largest node): the earliest end of an exemption
        # (minimum runtime, grown), i.e. when a job of that rank still too young to preempt
        # becomes a candidate, and how big a gang its node could hold.
        self._exempt_end: dict[str, dict[tuple[int, int], float]] = defaultdict(dict)
        self._state = state
        for job in running:
            on_ready = all(n in state.node for n, _ in job.allocations)
            if not on_ready:
                continue  # its GPUs would not be reusable anyway
            signalled = job.preemption_requested_at is not None
            grown = max(0, job.times_preempted - exempt_after)  # growth starts after `exempt_after`
            # The job's own flag decides, not its class's: submission sets it from the class's policy
            # unless the client chose (a non-preemptible class may volunteer; opting out of a
            # preemptible class is refused there), so the class is already in it.
            could = job.preemptible
            exempt = min_runtime * exempt_growth**grown
            eligible = could and now - job.started_at >= exempt
            # A job that reaches its wall limit before its exemption ends never becomes a victim
            # (QA: a 45-s job was named as stopping being exempt in 10 minutes).
            if could and not signalled and not eligible and exempt < job.max_wall_seconds:
                ends = self._exempt_end[job.gpu_type]
                key = (rank_of(job.priority_class), max(state.node[n].gpu_count for n, _ in job.allocations))
                ends[key] = min(ends.get(key, job.started_at + exempt), job.started_at + exempt)
            if not (signalled or eligible):
                continue
            self.rank[job.id] = rank_of(job.priority_class)
            self.fs[job.id] = fs_of(job)
            for node_id, _ in job.allocations:
                self.by_node[node_id].append(job)
        self.min_rank_by_node = {n: min(self.rank[j.id] for j in js) for n, js in self.by_node.items()}
        # Nodes with candidates per GPU type, in by_node order (plan() breaks cost ties by order).
        self.nodes_of_type: dict[str, list[int]] = defaultdict(list)
        # Per node: candidates already in victim order (a stable sort, so a filtered list is in the
        # order sorting it would give), and each candidate's GPU count on that node.
        self.ranked_by_node: dict[int, list[RunningJob]] = {}
        self.gpus_on: dict[int, dict[int, int]] = {}
        for node_id, jobs in self.by_node.items():
            self.nodes_of_type[state.node[node_id].gpu_type].append(node_id)
            self.ranked_by_node[node_id] = sorted(jobs, key=self._key)
            counts: dict[int, int] = defaultdict(int)
            for job in jobs:
                for m, idx in job.allocations:
                    if m == node_id:
                        counts[job.id] += len(idx)
            self.gpus_on[node_id] = counts

    def exempt_until(self, types: list[str], rank: int, gpus: int) -> float | None:
        """When the first job of a lower rank than `rank` on one of `types` stops being exempt
        from preemption (None: no such job); shown to a blocked job that found no victims. For a
        gang that fits one node, only jobs on nodes at least that big count (QA: a 4-GPU node's
        job was named to an 8-GPU gang)."""
        ends = [
            end for t in types for (r, size), end in self._exempt_end.get(t, {}).items()
            if r < rank and (size >= gpus or self._state.is_multi(t, gpus))
        ]
        return min(ends) if ends else None

    def requeue_priority(self, job: RunningJob) -> float:
        hit = self.prio.get(job.id)
        if hit is None:
            hit = self.prio[job.id] = self._prio_of(job)
        return hit

    def _key(self, job: RunningJob) -> tuple[int, int, float, int, float]:
        signalled = 0 if job.preemption_requested_at is not None else 1
        return (signalled, self.rank[job.id], self.fs[job.id], -job.gpu_count, -job.started_at)

    def _choose(
        self, cands: list[RunningJob], have: int, need: int, on: Callable[[RunningJob], int]
    ) -> list[RunningJob] | None:
        return self._take(sorted(cands, key=self._key), have, need, on)

    @staticmethod
    def _take(
        ranked: list[RunningJob], have: int, need: int, on: Callable[[RunningJob], int]
    ) -> list[RunningJob] | None:
        """Victims in `ranked` order until the gang fits, minus those that turn out not needed."""
        chosen: list[RunningJob] = []
        for job in ranked:
            if have >= need:
                break
            chosen.append(job)
            have += on(job)
        if have < need:
            return None
        # Drop victims we turned out not to need, most valuable (last chosen) first.
        for job in reversed(list(chosen)):
            if have - on(job) >= need:
                chosen.remove(job)
                have -= on(job)
        return chosen

    def usable(self, job: RunningJob, gpu_type: str, rank: int, priority: float, min_left: float) -> bool:
        """Whether `job` is a candidate (on ready nodes; signalled, or past its exemption) that may be a
        victim of a job of class `rank` and `priority` (see `_usable`)."""
        return job.id in self.rank and self._usable(job, gpu_type, rank, priority, min_left)

    def _usable(self, job: RunningJob, gpu_type: str, rank: int, priority: float, min_left: float) -> bool:
        """Whether `job` may be a victim of a job of class `rank` and `priority` (see `plan`)."""
        if job.id in self.claimed or job.gpu_type != gpu_type or self.rank[job.id] >= rank:
            return False
        if job.preemption_requested_at is not None:
            return True
        if min_left and job.started_at + job.max_wall_seconds - self.now < min_left:
            return False
        return self.requeue_priority(job) < priority

    def quota_plan(
        self,
        state: FleetState,
        gpu_type: str,
        g: int,
        regions: tuple[str, ...],
        rank: int,
        priority: float,
        min_left: float,
        owner: tuple[int, int],
        deficits: tuple[int, int],
        gone_by: float = 0.0,
    ) -> Plan | None:
        """Victims among the preemptor's own org's and project's jobs on `gpu_type` whose exit
        brings their concurrent-GPU use under quota for a gang of g (Kueue's preemption within a
        queue), or None. `owner` = (org id, project id); `deficits` = GPUs that must be freed at
        the (org, project) level. Same victim rules as `plan` (strictly lower class, below the
        preemptor if queued again, `min_left`); jobs already signalled count first. The gang must
        also fit the GPUs free now plus the victims' (without other victims: no mixed plans). A job
        not yet signalled that reaches its wall by `gone_by` frees its room by itself: not a victim
        (the deficits do not count it either)."""
        org_id, project_id = owner
        need_org, need_project = deficits
        cands = sorted(
            (j for js in self.by_node.values() for j in js
             if j.org_id == org_id and self._usable(j, gpu_type, rank, priority, min_left)
             and (j.preemption_requested_at is not None or j.started_at + j.max_wall_seconds > gone_by)),
            key=self._key,
        )
        cands = list(dict.fromkeys(cands))  # a multi-node victim is listed once per node
        chosen: list[RunningJob] = []
        freed_project = 0
        for job in cands:  # the project's own jobs first, while its quota is short
            if freed_project >= need_project:
                break
            if job.project_id == project_id:
                chosen.append(job)
                freed_project += job.gpu_count
        if freed_project < need_project:
            return None
        freed_org = sum(j.gpu_count for j in chosen)
        for job in cands:
            if freed_org >= need_org:
                break
            if job not in chosen:
                chosen.append(job)
                freed_org += job.gpu_count
        if freed_org < need_org:
            return None
        sim = {n: set(free) for n, free in state.free.items()}
        for v in chosen:
            for m, idx in v.allocations:
                if m in sim:
                    sim[m].update(idx)
        alloc = _fit(state, sim, gpu_type, g, regions)
        if alloc is None:
            return None
        return Plan(tuple(chosen), alloc, self._cost(chosen, 0))

    def _cost(self, victims: list[RunningJob], stranded: int) -> tuple[int, int, float, int]:
        new = [v for v in victims if v.preemption_requested_at is None]
        top = max((self.rank[v.id] for v in new), default=0)
        return (len(new), top, sum(self.fs[v.id] for v in new), stranded)

    def plan(
        self,
        state: FleetState,
        gpu_type: str,
        g: int,
        regions: tuple[str, ...],
        rank: int,
        priority: float,
        min_left: float = 0.0,
    ) -> Plan | None:
        """Best plan for a gang of g on `gpu_type` for a job of class `rank`, or None.

        A victim must be of a strictly lower class *and* rank below the preemptor if it were queued
        again now (its aging included). Without the second rule an aged victim re-queues ahead of
        its preemptor, takes its GPUs back, and the preemptor preempts someone else: a storm.
        A victim not yet signalled must also have at least `min_left` seconds to go before its
        wall limit (stopping a job that is about to end gains nothing).
        """
        best: Plan | None = None

        def usable(job: RunningJob) -> bool:
            return self._usable(job, gpu_type, rank, priority, min_left)

        if not state.is_multi(gpu_type, g):
            failed = self._failed.setdefault((gpu_type, regions), [])
            if _dominated(failed, rank, g, min_left, priority):
                return None
            for node_id in self.nodes_of_type.get(gpu_type, ()):
                node = state.node[node_id]
                if node.gpu_count < g or self.min_rank_by_node[node_id] >= rank:
                    continue
                if regions and node.region not in regions:
                    continue
                cands = [j for j in self.ranked_by_node[node_id] if usable(j)]
                if not cands:
                    continue
                gpus = self.gpus_on[node_id]

                def on_node(job: RunningJob, gpus: dict[int, int] = gpus) -> int:
                    return gpus[job.id]

                have = len(state.free[node_id])
                chosen = self._take(cands, have, g, on_node)
                if chosen is None:
                    continue
                gained = have + sum(on_node(v) for v in chosen)
                cost = self._cost(chosen, gained - g)
                if best is None or cost < best.cost:
                    victim_idx = [i for v in chosen for m, idx in v.allocations if m == node_id for i in idx]
                    picks = (sorted(victim_idx) + sorted(state.free[node_id]))[:g]
                    best = Plan(tuple(chosen), ((node_id, tuple(sorted(picks))),), cost)
            if best is None:
                failed.append((rank, g, min_left, priority))
            return best
        for gkey in state.groups_of.get(gpu_type, []):
            if regions and state.group_region[gkey] not in regions:
                continue
            members = state.group_nodes[gkey]
            member_set = set(members)
            seen: dict[int, RunningJob] = {}
            for n in members:
                for j in self.by_node.get(n, ()):
                    if usable(j):
                        seen[j.id] = j

            def in_group(job: RunningJob, ms: set[int] = member_set) -> int:
                return sum(len(idx) for m, idx in job.allocations if m in ms)

            have = state.group_free[gkey]
            chosen = self._choose(list(seen.values()), have, g, in_group)
            if chosen is None:
                continue
            gained = have + sum(in_group(v) for v in chosen)
            cost = self._cost(chosen, gained - g)
            if best is None or cost < best.cost:
                sim = {n: set(state.free[n]) for n in members}
                for v in chosen:
                    for m, idx in v.allocations:
                        if m in sim:
                            sim[m].update(idx)
                alloc = pick_in_group(members, sim, state.node, g)
                if alloc is not None:
                    best = Plan(tuple(chosen), alloc, cost)
        return best


def _dominated(
    failed: list[tuple[int, int, float, float]], rank: int, g: int, min_left: float, priority: float
) -> bool:
    """Whether a single-node search is bound to fail because an easier one already failed.

    A search fails when every node's free GPUs plus its usable victims' GPUs are fewer than g.
    Within a pass free GPUs only shrink and claimed victims only grow, and a lower class, a lower
    priority or a larger `min_left` only removes usable victims, so a search asking for at least
    as many GPUs with no more victims allowed fails too (exact: no search that could succeed is
    skipped).
    """
    for f_rank, f_g, f_left, f_prio in failed:
        if rank <= f_rank and g >= f_g and min_left >= f_left and priority <= f_prio:
            return True
    return False


def _fit(
    state: FleetState, free: dict[int, set[int]], gpu_type: str, g: int, regions: tuple[str, ...]
) -> Allocation | None:
    """A gang of g on `gpu_type` within `free` (the pass's free GPUs plus victims'): the tightest
    single node, or for a gang larger than a node, the fewest nodes of one IB group."""
    nodes = [n for n, node in state.node.items()
             if node.gpu_type == gpu_type and (not regions or node.region in regions)]
    if not state.is_multi(gpu_type, g):
        fits = [n for n in nodes if len(free[n]) >= g]
        if not fits:
            return None
        n = min(fits, key=lambda x: (len(free[x]), x))
        return ((n, tuple(sorted(free[n])[:g])),)
    for gkey in state.groups_of.get(gpu_type, []):
        members = [n for n in state.group_nodes[gkey] if n in nodes]
        if members and sum(len(free[n]) for n in members) >= g:
            return pick_in_group(members, free, state.node, g)
    return None
