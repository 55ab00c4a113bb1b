"""Tiny builders for core tests: a fleet, jobs and a snapshot in one line each (no DB)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from scheduling.core import (
    Config,
    GpuType,
    Node,
    PendingJob,
    Quotas,
    RunningJob,
    Shares,
    Snapshot,
    Usage,
)

TYPES = {
    "H100": GpuType("H100", 80, 3_000_000),
    "A100": GpuType("A100", 40, 1_800_000),
    "T4": GpuType("T4", 16, 350_000),
}


def node(
    nid: int, gpu_type: str = "H100", gpus: int = 8, free: Iterable[int] | None = None, **kw: Any
) -> Node:
    idx = frozenset(range(gpus) if free is None else free)
    return Node(nid, gpu_type, gpus, idx, **kw)


def job(
    jid: int, gpus: int = 1, cls: str = "standard", submitted: float = 0.0, wall: float = 3600.0, **kw: Any
) -> PendingJob:
    kw.setdefault("org_id", 1)
    kw.setdefault("project_id", 10)
    kw.setdefault("user_id", 100)
    return PendingJob(
        id=jid, priority_class=cls, gpu_count=gpus, max_wall_seconds=wall, submitted_at=submitted, **kw
    )


def running(
    jid: int,
    alloc: tuple[tuple[int, tuple[int, ...]], ...],
    cls: str = "batch",
    started: float = 0.0,
    wall: float = 3600.0,
    gpu_type: str = "H100",
    **kw: Any,
) -> RunningJob:
    kw.setdefault("org_id", 2)
    kw.setdefault("project_id", 20)
    kw.setdefault("user_id", 200)
    kw.setdefault("preemptible", True)
    return RunningJob(
        id=jid,
        attempt_id=jid * 10,
        priority_class=cls,
        gpu_type=gpu_type,
        allocations=alloc,
        started_at=started,
        max_wall_seconds=wall,
        **kw,
    )


def snap(
    nodes: Iterable[Node],
    pending: Iterable[PendingJob] = (),
    run: Iterable[RunningJob] = (),
    now: float = 10_000.0,
    usage: Usage | None = None,
    shares: Shares | None = None,
    quotas: Quotas | None = None,
    **cfg: Any,
) -> Snapshot:
    nodes = tuple(nodes)
    run = tuple(run)
    # Keep node free sets consistent with running allocations, as the adapter does.
    busy: dict[int, set[int]] = {}
    for r in run:
        for nid, idx in r.allocations:
            busy.setdefault(nid, set()).update(idx)
    fixed = tuple(replace(n, free_gpu_indices=n.free_gpu_indices - busy.get(n.id, set())) for n in nodes)
    return Snapshot(
        now=now,
        gpu_types=TYPES,
        nodes=fixed,
        running=run,
        pending=tuple(pending),
        usage=usage or Usage(),
        shares=shares or Shares(),
        quotas=quotas or Quotas(),
        config=Config(**cfg),
    )
