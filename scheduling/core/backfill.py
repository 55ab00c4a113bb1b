"""EASY backfill: the earliest start of a blocked job, from running jobs' max wall times.

The reservation names the exact GPUs the blocked job will use at `start_at`. Backfill then lets a
lower job start only if it ends (by its max wall) before `start_at`, or if it avoids those GPUs;
either way the reserved job can start no later than `start_at`, provided running jobs honour their
wall limits (they are killed at the limit, so they do).

Nodes out of the pass only for a maintenance window with a known end (`returning`: inside the
window, or ready but held out for a window too close) count too: each GPU they report free frees
at the window's end, each GPU a running job holds then or when that job frees it, if later (a GPU
reported busy with no known job on it never). No job is ever placed on such a node
before that end except by `fill_before_maintenance`, whose jobs end before the window starts, so
a reservation there is never delayed by this pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

from scheduling.core.model import Allocation, Node, RunningJob
from scheduling.core.placement import FleetState, GroupKey, group_key, pick_in_group

Release = tuple[float, int, tuple[int, ...]]
"""(time the GPUs become free, node_id, gpu indices)."""


def release_time(job: RunningJob, now: float, grace_seconds: float) -> float:
    """When a running job's GPUs are free at the latest: its wall limit, or the end of its grace."""
    # An attempt past its limit is being killed right now; count it as freeing now.
    return max(now, job.ends_by(grace_seconds))


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


def returning_releases(
    returning: Mapping[int, Node], running: Iterable[RunningJob], now: float, grace_seconds: float
) -> dict[str, list[Release]]:
    """Releases of the GPUs of nodes back from maintenance: each GPU the node reports free at the
    window's end (`maintenance_ends`, never before now), and each GPU a running job holds when that
    job frees it, if later. A GPU the node reports busy with no known job on it is never promised
    (as `FleetState` never offers one on a ready node)."""
    held: dict[tuple[int, int], float] = {}
    for job in running:
        t = None
        for node_id, idx in job.allocations:
            if node_id in returning:
                t = release_time(job, now, grace_seconds) if t is None else t
                for i in idx:
                    held[(node_id, i)] = t
    out: dict[str, list[Release]] = defaultdict(list)
    for node_id, node in returning.items():
        back = max(now, node.maintenance_ends or now)
        at: dict[float, list[int]] = defaultdict(list)
        for i in range(node.gpu_count):
            if (node_id, i) in held:
                at[max(back, held[(node_id, i)])].append(i)
            elif i in node.free_gpu_indices:
                at[back].append(i)
        for t, idx in at.items():
            out[node.gpu_type].append((t, node_id, tuple(idx)))
    return out


def earliest_start(
    state: FleetState,
    gpu_type: str,
    gpu_count: int,
    regions: tuple[str, ...],
    releases: list[Release],
    excluded: set[tuple[int, int]],
    returning: Mapping[int, Node] | None = None,
) -> tuple[float, Allocation] | None:
    """Walk future releases in time order until the gang fits; None if it never fits the ready fleet
    (and the `returning` nodes, when given: nodes back from maintenance, none of their GPUs free
    now, their GPUs' releases in `releases`; a gang larger than every ready node of the type but
    not larger than a returning one then needs one node).

    `excluded` are running GPUs already promised to another job (preemption victims' GPUs).
    The allocation prefers GPUs that are busy now, so as few currently-free GPUs as possible are
    held back from backfill.
    """
    returning = returning or {}
    back = {n: node for n, node in returning.items()
            if node.gpu_type == gpu_type and (not regions or node.region in regions)}
    nodes = [
        n
        for n, node in state.node.items()
        if node.gpu_type == gpu_type and (not regions or node.region in regions)
    ]
    if back:
        nodes = sorted(nodes + list(back))
    if not nodes:
        return None
    free: dict[int, set[int]] = state.free
    node_of: dict[int, Node] = state.node
    group_of: dict[int, GroupKey] = state.group_of
    multi = state.is_multi(gpu_type, gpu_count)
    if back:
        free = {**{n: state.free[n] for n in nodes if n not in back}, **{n: set() for n in back}}
        node_of = {n: back.get(n) or state.node[n] for n in nodes}
        group_of = {n: group_key(node_of[n]) for n in nodes}
        largest = max((node.gpu_count for node in returning.values() if node.gpu_type == gpu_type), default=0)
        multi = gpu_count > max(state.max_gpus.get(gpu_type, 0), largest)
    later: dict[int, list[int]] = defaultdict(list)
    group_total: dict[GroupKey, int] = defaultdict(int)
    node_set = set(nodes)
    for n in nodes:
        group_total[group_of[n]] += len(free[n])
    for t, node_id, idx in sorted(releases):
        if node_id not in node_set:
            continue
        fresh = [i for i in idx if (node_id, i) not in excluded]
        if not fresh:
            continue
        later[node_id].extend(fresh)
        gkey = group_of[node_id]
        group_total[gkey] += len(fresh)
        if not multi:
            have = len(later[node_id]) + len(free[node_id])
            if have >= gpu_count:
                picks = (later[node_id] + sorted(free[node_id]))[:gpu_count]
                return t, ((node_id, tuple(sorted(picks))),)
        elif group_total[gkey] >= gpu_count:
            members = ([n for n in state.group_nodes[gkey] if n in node_set] if not back
                       else [n for n in nodes if group_of[n] == gkey])
            # Prefer later-freed GPUs by presenting them as the only free ones first.
            sim = {n: set(later.get(n, ())) for n in members}
            need = gpu_count - sum(len(s) for s in sim.values())
            for n in members:
                if need <= 0:
                    break
                extra = sorted(free[n])[:need]
                sim[n].update(extra)
                need -= len(extra)
            alloc = pick_in_group(members, sim, node_of, gpu_count)
            if alloc is not None:
                return t, alloc
    return None
