"""Trace loaders for bench/replay.py: real jobs and a fleet, as plain data (no Django).

Reads ../shared/traces/ (relative to the repository root); nothing is copied into the repository.
Every synthetic choice (fleet size, prices, wall times, classes, tenants) is deterministic and
documented here and in docs/scheduler.md.
"""

from __future__ import annotations

import ast
import csv
import json
import random
import zlib
from dataclasses import dataclass
from pathlib import Path

from scheduling.core import GpuType, Node

TRACES = Path(__file__).resolve().parent.parent.parent / "shared" / "traces"

# Philly GPUs mapped to a modern fleet, keeping Gavel's measured speed ratios.
PHILLY_MAP = {"v100": "H100", "p100": "A100", "k80": "T4"}
CLASS_CUTS = ((5, "production"), (15, "premium"), (60, "standard"), (85, "batch"), (100, "interactive"))


@dataclass(slots=True)
class TraceJob:
    """One job of a trace: arrival, gang size, and its run time on each GPU type it can use."""

    id: int
    team: int
    user: int
    arrival: float
    gpu_count: int
    duration: dict[str, float]
    """Seconds of exclusive run time on each acceptable type; fastest type first (= preference)."""
    priority_class: str
    wall_factor: float
    """Requested wall time = duration on the placed type x this factor (U(1, 3), seeded)."""


@dataclass(slots=True)
class Trace:
    name: str
    jobs: list[TraceJob]
    teams: list[str]
    gpu_types: dict[str, GpuType]
    nodes: list[Node]
    notes: list[str]
    speed: dict[str, float]
    """Average speed of each GPU type relative to the fastest (for normalized utilization)."""


def _h(text: str) -> int:
    """Stable hash (Python's hash() is salted per process)."""
    return zlib.crc32(text.encode())


def _class_of(key: str) -> str:
    bucket = _h("class:" + key) % 100
    return next(name for cut, name in CLASS_CUTS if bucket < cut)


def _philly_throughput(table: dict, gpu: str, job_type: str, scale: int, extrapolate: bool) -> float:  # type: ignore[type-arg]
    row = table[gpu]
    hit = row.get(str((job_type, scale)), {}).get("null", 0.0)
    if hit or not extrapolate:
        return float(hit)
    # Gavel measured scale factors 1/2/4/8 only; larger (or unmeasured) gangs are extrapolated
    # linearly from the largest measured scale below them (optimistic, stated in the report).
    for s in (8, 4, 2, 1):
        if s < scale:
            base = row.get(str((job_type, s)), {}).get("null", 0.0)
            if base:
                return float(base) * scale / s
    return 0.0


def load_philly(
    *,
    limit: int | None = None,
    skip: int = 0,
    vcs: list[str] | None = None,
    seed: int = 0,
    load: float = 0.8,
    extrapolate: bool = True,
    gpus_per_type: int | None = None,
) -> Trace:
    root = TRACES / "philly-gavel"
    table = json.loads((root / "simulation_throughputs.json").read_text())
    files = sorted((root / "seed0").glob("*.trace"))
    if vcs:
        files = [f for f in files if f.stem in vcs]
    teams = [f.stem for f in files]
    rows: list[tuple[float, int, int, str, float, int]] = []
    for team, f in enumerate(files):
        for lineno, line in enumerate(f.read_text().splitlines()):
            p = line.split("\t")
            rows.append((float(p[5]), team, lineno, p[0], float(p[4]), int(p[6])))
    rows.sort()
    rng = random.Random(seed)
    # One draw per trace row in arrival order, so a window gets the same factors as the full trace.
    factors = [rng.uniform(1.0, 3.0) for _ in rows]
    end = skip + limit if limit else None
    rows, factors = rows[skip:end], factors[skip:end]
    jobs: list[TraceJob] = []
    dropped = 0
    for (arrival, team, lineno, job_type, steps, scale), wall_factor in zip(rows, factors, strict=True):
        dur: dict[str, float] = {}
        for gpu, name in PHILLY_MAP.items():
            tput = _philly_throughput(table, gpu, job_type, scale, extrapolate)
            if tput > 0:
                dur[name] = steps / tput
        if not dur:
            dropped += 1
            continue
        key = f"{teams[team]}/{lineno}"
        jobs.append(
            TraceJob(
                id=len(jobs) + 1,
                team=team,
                user=_h("user:" + key) % 4,
                arrival=arrival,
                gpu_count=scale,
                duration=dict(sorted(dur.items(), key=lambda kv: kv[1])),
                priority_class=_class_of(key),
                wall_factor=wall_factor,
            )
        )
    # Fleet: equal GPUs of each type, sized so the offered load is `load` of capacity, where each
    # type's capacity is weighted by the jobs' average speed on it relative to H100.
    first, last = min(j.arrival for j in jobs), max(j.arrival for j in jobs)
    span = last - first or 1.0
    # Offered load = average H100 GPUs busy during the arrival window if every job started on
    # arrival on H100 (work past the window is clipped, so --limit runs are sized like full ones).
    work = sum(
        j.gpu_count
        * max(0.0, min(last, j.arrival + j.duration.get("H100", min(j.duration.values()))) - j.arrival)
        for j in jobs
    )
    eff = {}
    for t in ("H100", "A100", "T4"):
        num = sum(j.gpu_count * j.duration["H100"] for j in jobs if "H100" in j.duration and t in j.duration)
        den = sum(j.gpu_count * j.duration[t] for j in jobs if "H100" in j.duration and t in j.duration)
        eff[t] = num / den if den else 0.0
    if gpus_per_type is None:
        per_type = work / span / load / sum(eff.values())
        biggest = max(j.gpu_count for j in jobs)
        gpus_per_type = max(round(per_type / 8.0) * 8, ((biggest + 7) // 8) * 8, 8)
    gpu_types = {
        # Prices per GPU-hour proportional to speed (H100 = 3.00 credits).
        t: GpuType(t, mem, round(3_000_000 * eff[t] / eff["H100"]) if eff["H100"] else 1_000_000)
        for t, mem in (("H100", 80), ("A100", 40), ("T4", 16))
    }
    nodes = _fleet({t: gpus_per_type for t in gpu_types}, gpus_per_node=8, nodes_per_ib_group=8)
    notes = [
        f"philly: {len(jobs)} jobs from {len(teams)} VCs ({dropped} dropped: no throughput on any type)",
        f"span {span / 86400:.1f} days, offered load {work / span:.0f} H100-GPUs busy on average",
        "speed vs H100: " + ", ".join(f"{t}={eff[t]:.2f}" for t in eff),
        f"fleet: {gpus_per_type} GPUs per type x 3 types = {3 * gpus_per_type} GPUs, 8 per node, "
        f"IB groups of 8 nodes (target load {load})",
        "extrapolated throughput for unmeasured scale factors (linear)"
        if extrapolate
        else "no extrapolation",
    ]
    return Trace("philly", jobs, teams, gpu_types, nodes, notes, eff)


def _fleet(gpus_by_type: dict[str, int], gpus_per_node: int, nodes_per_ib_group: int) -> list[Node]:
    nodes: list[Node] = []
    for t, total in gpus_by_type.items():
        for k in range((total + gpus_per_node - 1) // gpus_per_node):
            nid = len(nodes)
            nodes.append(
                Node(
                    id=nid,
                    gpu_type=t,
                    gpu_count=gpus_per_node,
                    free_gpu_indices=frozenset(range(gpus_per_node)),
                    region="r0",
                    nvlink_domain=f"{t}-nv{k}",
                    ib_group=f"{t}-ib{k // nodes_per_ib_group}",
                )
            )
    return nodes


ALIBABA_MEMORY = {"T4": 16, "P100": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "G2": 24, "G3": 32}
ALIBABA_PRICE = {"T4": 350_000, "P100": 800_000, "V100M16": 1_200_000, "V100M32": 1_400_000}


def load_alibaba(
    *, limit: int | None = None, seed: int = 0, tenants: int = 10, load: float | None = 0.8
) -> Trace:
    root = TRACES / "alibaba-openb"
    with (root / "openb_node_list_gpu_node.csv").open() as fh:
        node_rows = list(csv.DictReader(fh))
    with (root / "openb_pod_list_gpuspec33.csv").open() as fh:
        pod_rows = list(csv.DictReader(fh))
    models = sorted({r["model"] for r in node_rows})
    gpu_types = {m: GpuType(m, ALIBABA_MEMORY.get(m, 16), ALIBABA_PRICE.get(m, 1_000_000)) for m in models}
    rng = random.Random(seed)
    pods = []
    skipped = 0
    for r in pod_rows:
        if int(r["num_gpu"]) == 0 or not r["scheduled_time"] or not r["deletion_time"]:
            skipped += 1
            continue
        pods.append(r)
    pods.sort(key=lambda r: (float(r["creation_time"]), r["name"]))
    if limit:
        pods = pods[:limit]
    jobs: list[TraceJob] = []
    for r in pods:
        runtime = max(float(r["deletion_time"]) - float(r["scheduled_time"]), 1.0)
        spec = [s for s in r["gpu_spec"].split("|") if s in gpu_types] if r["gpu_spec"] else list(models)
        # A fractional GPU (gpu_milli < 1000) is scheduled as one whole GPU: the core is GPU-granular.
        count = int(r["num_gpu"])
        jobs.append(
            TraceJob(
                id=len(jobs) + 1,
                team=_h("tenant:" + r["name"]) % tenants,
                user=_h("user:" + r["name"]) % 4,
                arrival=float(r["creation_time"]),
                gpu_count=count,
                duration=dict.fromkeys(spec, runtime),  # no per-model speeds in this trace
                priority_class=_class_of(r["name"]),
                wall_factor=rng.uniform(1.0, 3.0),
            )
        )
    # The listed fleet (6,212 GPUs) is ~300x what these pods need on average, so nothing would ever
    # queue. With `load`, keep each model's share of the listed nodes (at least one node per model,
    # biggest nodes first) scaled so the offered load is `load` of capacity; None keeps all nodes.
    first = min(j.arrival for j in jobs)
    last = max(j.arrival for j in jobs)
    offered = sum(
        j.gpu_count * max(0.0, min(last, j.arrival + min(j.duration.values())) - j.arrival) for j in jobs
    )
    offered /= last - first or 1.0
    listed = sum(int(r["gpu"]) for r in node_rows)
    keep_share = 1.0 if load is None else min(1.0, offered / load / listed)
    by_model: dict[str, list[dict[str, str]]] = {}
    for r in node_rows:
        by_model.setdefault(r["model"], []).append(r)
    nodes: list[Node] = []
    for model in models:
        rows = sorted(by_model[model], key=lambda r: (-int(r["gpu"]), r["sn"]))
        gpus_wanted = keep_share * sum(int(r["gpu"]) for r in rows)
        kept, have = [], 0
        for r in rows:
            if kept and have >= gpus_wanted:
                break
            kept.append(r)
            have += int(r["gpu"])
        for k, r in enumerate(kept):
            count = int(r["gpu"])
            nodes.append(
                Node(
                    id=len(nodes),
                    gpu_type=model,
                    gpu_count=count,
                    free_gpu_indices=frozenset(range(count)),
                    region="r0",
                    nvlink_domain=r["sn"],
                    ib_group=f"{model}-ib{k // 8}",
                )
            )
    notes = [
        f"alibaba: offered load {offered:.1f} GPUs busy on average; fleet scaled to "
        f"{sum(n.gpu_count for n in nodes)} GPUs on {len(nodes)} nodes (target load {load})",
        f"alibaba: {len(jobs)} GPU pods ({skipped} skipped: no GPU or never scheduled), "
        f"node list has {len(node_rows)} nodes / {listed} GPUs",
        "tenant = crc32(pod name) % 10; gpu_milli < 1000 treated as 1 whole GPU; same speed on all models",
        "runtime = deletion_time - scheduled_time; G2/G3 memory assumed 24/32 GB",
    ]
    speed = dict.fromkeys(gpu_types, 1.0)
    return Trace("alibaba", jobs, [f"tenant{i}" for i in range(tenants)], gpu_types, nodes, notes, speed)


def parse_tuple_key(key: str) -> tuple[str, int]:
    """Inverse of str((job_type, scale)) used as keys in simulation_throughputs.json."""
    value = ast.literal_eval(key)
    return str(value[0]), int(value[1])
