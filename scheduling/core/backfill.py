"""EASY backfill: the earliest start of a blocked job, from running jobs' max wall times.

The reservation names the exact GPUs the blocked job will use at `start_at`. Backfill then lets a
lower job start only if it ends (by its max wall) before `start_at`, or if it avoids those GPUs;
either way the reserved job can start no later than `start_at`, provided running jobs honour their
wall limits (they are killed at the limit, so they do).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from scheduling.core.model import Allocation, RunningJob
from scheduling.core.placement import FleetState, GroupKey, pick_in_group

Release = tuple[float, int, tuple[int, ...]]
"""(time the GPUs become free, node_id, gpu indices)."""


def release_time(job: RunningJob, now: float, grace_seconds: float) -> float:
    """When a running job's GPUs are free at the latest: its wall limit, or the end of its grace."""
    end = job.started_at + job.max_wall_seconds
    if job.preemption_requested_at is not None:
        end = min(end, job.preemption_requested_at + grace_seconds)
    # An attempt past its limit is being killed right now; count it as freeing now.
    return max(now, end)


def releases_by_type(
    running: Iterable[RunningJob], state: FleetState, now: float, grace_seconds: float
) -> dict[str, list[Release]]:
    out: dict[str, list[Release]] = defaultdict(list)
    for job in running:
        t = release_time(job, now, grace_seconds)
        for node_id, idx in job.allocations:
            if node_id in state.node:  # GPUs on non-ready nodes never come back to this pass
                out[state.node[node_id].gpu_type].append((t, node_id, idx))
    return out


def earliest_start(
    state: FleetState,
    gpu_type: str,
    gpu_count: int,
    regions: tuple[str, ...],
    releases: list[Release],
    excluded: set[tuple[int, int]],
) -> tuple[float, Allocation] | None:
    """Walk future releases in time order until the gang fits; None if it never fits the ready fleet.

    `excluded` are running GPUs already promised to another job (preemption victims' GPUs).
    The allocation prefers GPUs that are busy now, so as few currently-free GPUs as possible are
    held back from backfill.
    """
    nodes = [
        n
        for n, node in state.node.items()
        if node.gpu_type == gpu_type and (not regions or node.region in regions)
    ]
    if not nodes:
        return None
    later: dict[int, list[int]] = defaultdict(list)
    multi = state.is_multi(gpu_type, gpu_count)
    group_total: dict[GroupKey, int] = defaultdict(int)
    node_set = set(nodes)
    for n in nodes:
        group_total[state.group_of[n]] += len(state.free[n])
    for t, node_id, idx in sorted(releases):
        if node_id not in node_set:
            continue
        fresh = [i for i in idx if (node_id, i) not in excluded]
        if not fresh:
            continue
        later[node_id].extend(fresh)
        gkey = state.group_of[node_id]
        group_total[gkey] += len(fresh)
        if not multi:
            have = len(later[node_id]) + len(state.free[node_id])
            if have >= gpu_count:
                picks = (later[node_id] + sorted(state.free[node_id]))[:gpu_count]
                return t, ((node_id, tuple(sorted(picks))),)
        elif group_total[gkey] >= gpu_count:
            members = [n for n in state.group_nodes[gkey] if n in node_set]
            # Prefer later-freed GPUs by presenting them as the only free ones first.
            sim = {n: set(later.get(n, ())) for n in members}
            need = gpu_count - sum(len(s) for s in sim.values())
            for n in members:
                if need <= 0:
                    break
                extra = sorted(state.free[n])[:need]
                sim[n].update(extra)
                need -= len(extra)
            alloc = pick_in_group(members, sim, state.node, gpu_count)
            if alloc is not None:
                return t, alloc
    return None
