"""Free-GPU bookkeeping for one pass and best-fit gang placement.

Indexes keep a pass near O(jobs): ready nodes are bucketed by (gpu type, region) and free-GPU count,
so the tightest single node for a gang of g is found by scanning at most max-GPUs-per-node buckets;
IB groups keep a running free total so a multi-node gang scans groups, not nodes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from scheduling.core.model import Allocation, Node, RunningJob

GroupKey = tuple[str, str, str]
"""(gpu_type, region, ib_group): a group is split by region so a gang never spans regions."""


class FleetState:
    """Mutable free-GPU view of the ready fleet for one scheduling pass."""

    def __init__(
        self,
        nodes: Iterable[Node],
        running: Iterable[RunningJob],
        end_time_packing: str = "off",
        now: float = 0.0,
        grace_seconds: float = 0.0,
    ) -> None:
        busy: dict[int, set[int]] = defaultdict(set)
        # end_time_packing: node -> latest expected end of what runs on it (never before now).
        self.packing = end_time_packing if end_time_packing != "off" else ""
        self.now = now
        self.node_end: dict[int, float] = {}
        node_end = self.node_end
        for job in running:
            for node_id, idx in job.allocations:
                busy[node_id].update(idx)
            if self.packing:
                end = job.ends_by(grace_seconds)
                for node_id, _ in job.allocations:
                    if end > node_end.get(node_id, now):
                        node_end[node_id] = end
        self.node: dict[int, Node] = {}
        self.free: dict[int, set[int]] = {}
        self.max_gpus: dict[str, int] = {}
        self.capacity: dict[str, int] = defaultdict(int)  # ready GPUs per type
        self.regions_of: dict[str, list[str]] = defaultdict(list)
        self.groups_of: dict[str, list[GroupKey]] = defaultdict(list)
        self.group_nodes: dict[GroupKey, list[int]] = defaultdict(list)
        self.group_region: dict[GroupKey, str] = {}
        self.group_free: dict[GroupKey, int] = defaultdict(int)
        self.group_of: dict[int, GroupKey] = {}
        self.buckets: dict[tuple[str, str], list[dict[int, None]]] = {}
        # Reservations hold currently-free GPUs out of the pool: job_id -> node -> indices.
        self.masked: dict[int, dict[int, set[int]]] = {}
        self.free_total = 0  # free GPUs in the pool, all types (masked ones are not in it)
        ready = sorted((n for n in nodes if n.state == "ready"), key=lambda n: n.id)
        for n in ready:
            self.max_gpus[n.gpu_type] = max(self.max_gpus.get(n.gpu_type, 0), n.gpu_count)
        for n in ready:
            self.node[n.id] = n
            self.capacity[n.gpu_type] += n.gpu_count
            # Trust neither side alone: a GPU is free only if the node says so and no running
            # allocation claims it, and only if the index exists on the node.
            free = {i for i in n.free_gpu_indices if 0 <= i < n.gpu_count} - busy.get(n.id, set())
            self.free[n.id] = free
            self.free_total += len(free)
            bkey = (n.gpu_type, n.region)
            if bkey not in self.buckets:
                self.buckets[bkey] = [{} for _ in range(self.max_gpus[n.gpu_type] + 1)]
                self.regions_of[n.gpu_type].append(n.region)
            self.buckets[bkey][len(free)][n.id] = None
            gkey = group_key(n)
            if gkey not in self.group_region:
                self.group_region[gkey] = n.region
                self.groups_of[n.gpu_type].append(gkey)
            self.group_of[n.id] = gkey
            self.group_nodes[gkey].append(n.id)
            self.group_free[gkey] += len(free)

    # -- mutation -------------------------------------------------------------------------------
    def _move(self, node_id: int, before: int) -> None:
        n = self.node[node_id]
        bucket = self.buckets[(n.gpu_type, n.region)]
        del bucket[before][node_id]
        after = len(self.free[node_id])
        bucket[after][node_id] = None
        self.group_free[self.group_of[node_id]] += after - before
        self.free_total += after - before

    def note_end(self, allocations: Allocation, end: float) -> None:
        """A job placed on `allocations` is expected to end at `end` (end_time_packing only)."""
        node_end = self.node_end
        for node_id, _ in allocations:
            if end > node_end.get(node_id, self.now):
                node_end[node_id] = end

    def take(self, allocations: Allocation) -> None:
        for node_id, idx in allocations:
            before = len(self.free[node_id])
            self.free[node_id].difference_update(idx)
            self._move(node_id, before)

    def give(self, node_id: int, idx: Iterable[int]) -> None:
        before = len(self.free[node_id])
        self.free[node_id].update(idx)
        self._move(node_id, before)

    def mask(self, job_id: int, allocations: Allocation) -> None:
        """Hold the currently-free GPUs of `allocations` for `job_id` (others are busy anyway)."""
        held: dict[int, set[int]] = {}
        for node_id, idx in allocations:
            if node_id not in self.free:
                continue
            now_free = self.free[node_id].intersection(idx)
            if now_free:
                held[node_id] = now_free
                self.take(((node_id, tuple(now_free)),))
        self.masked[job_id] = held

    def unmask(self, job_id: int) -> None:
        for node_id, idx in self.masked.get(job_id, {}).items():
            self.give(node_id, idx)

    def remask(self, job_id: int) -> None:
        """Re-hold whatever a short backfill job did not take while the mask was lifted."""
        held = self.masked.get(job_id, {})
        for node_id in list(held):
            still = held[node_id] & self.free[node_id]
            held[node_id] = still
            if still:
                self.take(((node_id, tuple(still)),))

    # -- queries --------------------------------------------------------------------------------
    def holds_any(self) -> bool:
        """Whether any reservation holds a currently-free GPU out of the pool."""
        return any(idx for held in self.masked.values() for idx in held.values())

    def mask_holder(self, gpu_type: str, g: int, regions: tuple[str, ...], job_ids: list[int]) -> int | None:
        """Which reservation's held GPUs would let a gang of g fit, without touching the pool.

        Only nodes with held GPUs can change the answer, so this reads a handful of nodes.
        """
        extra: dict[int, int] = defaultdict(int)
        owner: dict[int, int] = {}
        for jid in job_ids:
            for node_id, idx in self.masked.get(jid, {}).items():
                if idx:
                    extra[node_id] += len(idx)
                    owner.setdefault(node_id, jid)
        multi = self.is_multi(gpu_type, g)
        group_extra: dict[GroupKey, int] = defaultdict(int)
        for node_id, k in extra.items():
            n = self.node[node_id]
            if n.gpu_type != gpu_type or (regions and n.region not in regions):
                continue
            if not multi and len(self.free[node_id]) + k >= g:
                return owner[node_id]
            group_extra[self.group_of[node_id]] += k
        if multi:
            for gkey, k in group_extra.items():
                if self.group_free[gkey] + k >= g:
                    return owner[next(n for n in self.group_nodes[gkey] if n in owner)]
        return None

    def is_multi(self, gpu_type: str, gpu_count: int) -> bool:
        return gpu_count > self.max_gpus.get(gpu_type, 0)

    def find(
        self, gpu_type: str, gpu_count: int, regions: tuple[str, ...], end: float | None = None
    ) -> Allocation | None:
        """A gang of `gpu_count` on one type; `end` (the job's expected end) is read only when
        end-time packing is on, and only for a gang that fits one node."""
        if gpu_type not in self.max_gpus or gpu_count <= 0:
            return None
        if self.is_multi(gpu_type, gpu_count):
            return self._find_multi(gpu_type, gpu_count, regions)
        if self.packing and end is not None:
            return self._find_single_packed(gpu_type, gpu_count, regions, end)
        return self._find_single(gpu_type, gpu_count, regions)

    def _find_single_packed(
        self, gpu_type: str, g: int, regions: tuple[str, ...], end: float
    ) -> Allocation | None:
        """End-time-aware single-node fit: the node whose latest expected end is closest to `end`.

        "tightest": only nodes of the tightest-fitting free count are compared (fragmentation as
        without packing). "partial": every fitting node that already runs something is compared,
        free count breaking ties; an idle node (all its GPUs free) only if no busy node fits.
        Ties keep the order the plain tightest fit would use.
        """
        node_end, now, nodes, free = self.node_end, self.now, self.node, self.free
        best: tuple[float, int, int] | None = None  # (|node end - end|, free count, node id)
        idle: tuple[int, int] | None = None  # (free count, node id): the tightest idle node
        tightest = self.packing == "tightest"
        k_min = None
        if tightest:
            fit = self._tightest(gpu_type, g, regions)
            if fit is None:
                return None
            k_min = fit[0]
        for region in self.regions_of[gpu_type]:
            if regions and region not in regions:
                continue
            buckets = self.buckets[(gpu_type, region)]
            ks = (k_min,) if k_min is not None else range(g, len(buckets))
            for k in ks:
                if k >= len(buckets):
                    continue
                for node_id in buckets[k]:
                    if not tightest and k == nodes[node_id].gpu_count:
                        if idle is None or k < idle[0]:
                            idle = (k, node_id)
                        continue
                    d = abs(node_end.get(node_id, now) - end)
                    if best is None or (d, k) < best[:2]:
                        best = (d, k, node_id)
        if best is not None:
            node_id = best[2]
        elif idle is not None:
            node_id = idle[1]
        else:
            return None
        return ((node_id, tuple(sorted(free[node_id])[:g])),)

    def _tightest(self, gpu_type: str, g: int, regions: tuple[str, ...]) -> tuple[int, int] | None:
        """(free count, node) of the tightest single node with at least g free GPUs of the type in
        an allowed region (the first node of the smallest such free count), or None."""
        best: tuple[int, int] | None = None
        for region in self.regions_of[gpu_type]:
            if regions and region not in regions:
                continue
            buckets = self.buckets[(gpu_type, region)]
            for k in range(g, len(buckets)):
                if buckets[k]:
                    # Tightest fit first: a node left with 0 free strands nothing.
                    if best is None or k < best[0]:
                        best = (k, next(iter(buckets[k])))
                    break
        return best

    def _find_single(self, gpu_type: str, g: int, regions: tuple[str, ...]) -> Allocation | None:
        best = self._tightest(gpu_type, g, regions)
        if best is None:
            return None
        node_id = best[1]
        return ((node_id, tuple(sorted(self.free[node_id])[:g])),)

    def _find_multi(self, gpu_type: str, g: int, regions: tuple[str, ...]) -> Allocation | None:
        best: tuple[int, GroupKey] | None = None
        for gkey in self.groups_of[gpu_type]:
            if regions and self.group_region[gkey] not in regions:
                continue
            total = self.group_free[gkey]
            if total >= g and (best is None or total < best[0]):
                best = (total, gkey)
        if best is None:
            return None
        return pick_in_group(self.group_nodes[best[1]], self.free, self.node, g)


def group_key(n: Node) -> GroupKey:
    """The IB group a node belongs to; a node outside any IB group is a group of its own (it can
    never host a multi-node gang)."""
    return (n.gpu_type, n.region, n.ib_group or f"node:{n.id}")


def pick_in_group(
    node_ids: list[int], free: dict[int, set[int]], nodes: dict[int, Node], g: int
) -> Allocation | None:
    """Fewest nodes for a gang of g inside one IB group, staying in one NVLink domain when possible.

    Whole free nodes first (largest first, nodes of the freest NVLink domain first), then the
    tightest node that covers the remainder, so the last partial node strands as little as possible.
    """
    domain_free: dict[str, int] = defaultdict(int)
    for n in node_ids:
        domain_free[nodes[n].nvlink_domain] += len(free[n])
    cands = sorted(
        (n for n in node_ids if free[n]),
        key=lambda n: (-domain_free[nodes[n].nvlink_domain], nodes[n].nvlink_domain, -len(free[n]), n),
    )
    remaining = g
    chosen: list[tuple[int, tuple[int, ...]]] = []
    used: set[int] = set()
    while remaining > 0:
        fits = [n for n in cands if n not in used and len(free[n]) >= remaining]
        if fits:
            n = min(fits, key=lambda x: len(free[x]))
            chosen.append((n, tuple(sorted(free[n])[:remaining])))
            remaining = 0
            break
        rest = [n for n in cands if n not in used]
        if not rest:
            return None
        n = rest[0]
        used.add(n)
        chosen.append((n, tuple(sorted(free[n]))))
        remaining -= len(free[n])
    return tuple(sorted(chosen))
