"""Replay a real GPU trace through the scheduling core with a simulated clock (no database).

    python bench/replay.py --trace philly [--limit N] [--vcs 6214e9,b436b2] [--load 0.8]
    python bench/replay.py --trace alibaba [--limit N] [--seed S]

Runs FIFO, FIFO + EASY backfill and ours (fair share + backfill + preemption) on the same jobs and
fleet in one run, and prints one table. Event-driven: a scheduling pass runs at every instant when
something happens (arrival, completion, preempted job's exit), like a tick triggered early by a
submission or a finish. Jobs run exactly their trace duration on the type they were placed on and
are never killed early (requested wall = duration x U(1,3) >= duration). A preempted job keeps its
progress up to its exit (it checkpoints during the grace period) and is queued again with its
original submission time; `--restart-seconds R` makes each resumption run R seconds before it
progresses again (restore, reload), which free restarts (the default) leave out.
"""

from __future__ import annotations

import argparse
import heapq
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _traces import Trace, TraceJob, load_alibaba, load_philly

from scheduling.core import (
    Config,
    DecayingUsage,
    PendingJob,
    Place,
    Preempt,
    RunningJob,
    Snapshot,
    Usage,
    schedule,
)

ARRIVE, FINISH, EXIT = 0, 1, 2


@dataclass(slots=True)
class JobStats:
    """Outcome of one job under one policy."""

    first_start: float | None = None
    finish: float | None = None
    run_seconds: float = 0.0
    preempted: int = 0
    gpu_seconds: float = 0.0


@dataclass(slots=True)
class Attempt:
    """The job's current run: where, since when, and how much of the job was left at start."""

    running: RunningJob
    start: float
    remaining_at_start: float
    end: float
    overhead: float = 0.0
    """Seconds at the start of this attempt that make no progress (a resumed job's restart)."""


@dataclass
class Sim:
    trace: Trace
    config: Config
    label: str
    restart_seconds: float = 0.0
    """Cost of each resumption after a preemption: the attempt runs this long before it makes
    progress again (restore the checkpoint, reload, warm up). 0 = free restarts."""
    stats: dict[int, JobStats] = field(default_factory=dict)
    preemptions: int = 0
    passes: int = 0
    attempts: list[tuple[float, float, int, float, int]] = field(default_factory=list)
    """(start, end, gpus, speed vs the job's fastest type, team) of every attempt."""
    class_policy: dict[str, bool] = field(init=False, default_factory=dict)
    """Class name -> `preemptible_by_higher`: a trace job's own `preemptible` flag, as submission
    sets it for a client that does not choose (the core reads only the job's flag)."""

    def __post_init__(self) -> None:
        self.class_policy = {c.name: c.preemptible_by_higher for c in self.config.priority_classes}

    def run(self, progress: bool) -> None:
        cfg = self.config
        jobs = {j.id: j for j in self.trace.jobs}
        nodes = {n.id: n for n in self.trace.nodes}
        free = {n.id: set(n.free_gpu_indices) for n in self.trace.nodes}
        node_objs = dict(nodes)
        dirty: set[int] = set()
        remaining = {j.id: 1.0 for j in self.trace.jobs}  # fraction of the job's work left
        pending: dict[int, PendingJob] = {}
        running: dict[int, Attempt] = {}
        self.stats = {j.id: JobStats() for j in self.trace.jobs}
        usage = DecayingUsage(cfg.fairshare_half_life_seconds)
        last_accrual = 0.0
        attempt_seq = 0
        events: list[tuple[float, int, int, int]] = [(j.arrival, ARRIVE, j.id, 0) for j in self.trace.jobs]
        heapq.heapify(events)
        done = 0
        freed = False
        fifo_head_blocked = False
        total = len(jobs)
        t_wall = time.monotonic()
        while events:
            now = events[0][0]
            while events and events[0][0] == now:
                _, kind, jid, attempt = heapq.heappop(events)
                job = jobs[jid]
                if kind == ARRIVE:
                    pending[jid] = self._pending(job, job.arrival)
                    continue
                att = running.get(jid)
                if att is None or att.running.attempt_id != attempt:
                    continue  # stale: this attempt already ended
                del running[jid]
                freed = True
                for node_id, idx in att.running.allocations:
                    free[node_id].update(idx)
                    dirty.add(node_id)
                st = self.stats[jid]
                ran = now - att.start
                st.run_seconds += ran
                st.gpu_seconds += ran * job.gpu_count
                speed = min(job.duration.values()) / job.duration[att.running.gpu_type]
                if att.overhead and ran > 0:  # the restart is busy GPU time but no useful work
                    speed *= max(ran - att.overhead, 0.0) / ran
                self.attempts.append((att.start, now, job.gpu_count, speed, job.team))
                if kind == FINISH:
                    st.finish = now
                    remaining[jid] = 0.0
                    done += 1
                else:  # EXIT after preemption: progress kept, queued again
                    progress = max(ran - att.overhead, 0.0) / job.duration[att.running.gpu_type]
                    remaining[jid] = max(att.remaining_at_start - progress, 0.0)
                    if remaining[jid] <= 1e-9:
                        st.finish = now
                        done += 1
                    else:
                        pending[jid] = self._pending(job, job.arrival, remaining[jid], st.run_seconds)
            # Fair-share usage accrues for running jobs up to now (GPU-seconds, decayed).
            if now > last_accrual and cfg.policy == "fair":  # only the fair policy reads usage
                acc: dict[tuple[int, ...] | tuple[str, int] | tuple[str, int, int], float] = defaultdict(
                    float
                )
                for att in running.values():
                    r = att.running
                    gs = (now - max(last_accrual, att.start)) * r.gpu_count
                    acc[("o", r.org_id)] += gs
                    acc[("p", r.project_id)] += gs
                    acc[("u", r.project_id, r.user_id)] += gs
                for key, gs in acc.items():
                    usage.add(key, gs, now)
                last_accrual = now
            if not pending:
                continue
            if cfg.policy == "fifo" and fifo_head_blocked and not freed:
                # Exact shortcut for strict FIFO: nothing was freed and new arrivals queue behind
                # the blocked head, so this pass would decide exactly what the last one did.
                continue
            freed = False
            for node_id in dirty:
                node_objs[node_id] = replace(nodes[node_id], free_gpu_indices=frozenset(free[node_id]))
            dirty.clear()
            snap = Snapshot(
                now=now,
                gpu_types=self.trace.gpu_types,
                nodes=tuple(node_objs.values()),
                running=tuple(a.running for a in running.values()),
                pending=tuple(pending.values()),
                usage=self._usage(usage, now) if cfg.policy == "fair" else Usage(),
                config=cfg,
            )
            result = schedule(snap)
            self.passes += 1
            fifo_head_blocked = any(
                d.reason_code == "resources" for d in result.decisions if not isinstance(d, (Place, Preempt))
            )
            for d in result.decisions:
                if isinstance(d, Place):
                    job = jobs[d.job_id]
                    pj = pending.pop(d.job_id)
                    attempt_seq += 1
                    rem = remaining[d.job_id]
                    overhead = self.restart_seconds if self.stats[job.id].preempted else 0.0
                    end = now + overhead + rem * job.duration[d.gpu_type]
                    rj = RunningJob(
                        id=job.id,
                        attempt_id=attempt_seq,
                        org_id=pj.org_id,
                        project_id=pj.project_id,
                        user_id=pj.user_id,
                        priority_class=pj.priority_class,
                        preemptible=pj.preemptible,
                        gpu_type=d.gpu_type,
                        allocations=d.allocations,
                        started_at=now,
                        max_wall_seconds=d.max_wall_seconds,
                        submitted_at=pj.submitted_at,
                        prior_run_seconds=pj.run_seconds,
                        times_preempted=self.stats[job.id].preempted,
                        gpu_types=pj.gpu_types,
                        gpu_memory_gb=pj.gpu_memory_gb,
                        max_wall_by_type=pj.max_wall_by_type,
                    )
                    running[job.id] = Attempt(rj, now, rem, end, overhead)
                    for node_id, idx in d.allocations:
                        assert free[node_id].issuperset(idx), "double allocation"
                        free[node_id].difference_update(idx)
                        dirty.add(node_id)
                    st = self.stats[job.id]
                    if st.first_start is None:
                        st.first_start = now
                    heapq.heappush(events, (end, FINISH, job.id, attempt_seq))
                elif isinstance(d, Preempt):
                    att = running[d.job_id]
                    att.running = replace(att.running, preemption_requested_at=now)
                    self.preemptions += 1
                    self.stats[d.job_id].preempted += 1
                    exit_at = now + d.grace_seconds
                    if exit_at < att.end:
                        heapq.heappush(events, (exit_at, EXIT, d.job_id, att.running.attempt_id))
            if progress and self.passes % 2000 == 0:
                print(
                    f"  [{self.label}] t={now / 86400:6.1f}d done={done}/{total} pending={len(pending)} "
                    f"running={len(running)} passes={self.passes} ({time.monotonic() - t_wall:.0f}s)",
                    file=sys.stderr,
                    flush=True,
                )
        unfinished = [jid for jid, st in self.stats.items() if st.finish is None]
        if unfinished:
            print(f"  [{self.label}] {len(unfinished)} jobs never finished (cannot fit)", file=sys.stderr)

    def _pending(
        self, job: TraceJob, submitted: float, remaining: float = 1.0, ran: float = 0.0
    ) -> PendingJob:
        walls = tuple((t, d * remaining * job.wall_factor) for t, d in job.duration.items())
        return PendingJob(
            id=job.id,
            org_id=job.team,
            project_id=job.team,
            user_id=job.user,
            priority_class=job.priority_class,
            gpu_count=job.gpu_count,
            max_wall_seconds=max(w for _, w in walls),
            submitted_at=submitted,
            gpu_types=tuple(job.duration),
            preemptible=self.class_policy.get(job.priority_class, True),
            max_wall_by_type=walls,
            run_seconds=ran,
        )

    @staticmethod
    def _usage(usage: DecayingUsage, now: float) -> Usage:
        org: dict[int, float] = {}
        proj: dict[int, float] = {}
        user: dict[tuple[int, int], float] = {}
        for key, v in usage.values_at(now).items():
            assert isinstance(key, tuple)
            if key[0] == "o":
                org[key[1]] = v
            elif key[0] == "p":
                proj[key[1]] = v
            else:
                user[(key[1], key[2])] = v
        return Usage(org=org, project=proj, user=user)


def _outcomes(sim: Sim) -> list[list[float | str]]:
    """Per job: [id, team, gpus, arrival, first_start, finish, run_seconds, fastest runtime,
    preemptions, class]; -1 for a start or finish that never happened."""
    out = []
    for j in sim.trace.jobs:
        st = sim.stats[j.id]
        out.append(
            [
                j.id,
                j.team,
                j.gpu_count,
                j.arrival,
                -1.0 if st.first_start is None else st.first_start,
                -1.0 if st.finish is None else st.finish,
                st.run_seconds,
                min(j.duration.values()),
                st.preempted,
                j.priority_class,
            ]
        )
    return out


@contextmanager
def _chart(path: Path, title: str, xlabel: str, ylabel: str, legend: str) -> Iterator[Any]:
    """One log-x step chart written as PNG to `path`; yields the axes to draw on (matplotlib is
    only needed when a chart is asked for)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=110)
    yield ax
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc=legend)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_cdf(path: Path, title: str, curves: dict[str, list[float]]) -> None:
    """JCT CDF per policy (log hours), one line each."""
    xlabel = "job completion time (hours, log scale)"
    with _chart(path, title, xlabel, "fraction of jobs", "lower right") as ax:
        for label, xs in curves.items():
            n = len(xs)
            ax.step(
                xs,
                [(i + 1) / n for i in range(n)],
                where="post",
                label=f"{label} (avg {statistics.fmean(xs):.0f} h)",
            )


def plot_preemptions(path: Path, title: str, counts: dict[str, list[int]]) -> None:
    """Jobs preempted at least k times, against k (both log), one line per policy that preempts:
    a storm shows as a long tail to the right."""
    xlabel, ylabel = "preemptions of one job, k (log scale)", "jobs preempted at least k times"
    with _chart(path, title, xlabel, ylabel, "upper right") as ax:
        ax.set_yscale("log")
        for label, per_job in counts.items():
            hit = sorted((k for k in per_job if k > 0), reverse=True)
            if not hit:
                continue  # FIFO, FIFO+EASY: nothing to draw
            ks = sorted(set(hit))
            at_least = [sum(1 for k in hit if k >= x) for x in ks]
            ax.step(ks, at_least, where="post", label=f"{label} ({sum(hit):,} in all, at most {hit[0]})")


def _from_dumps(names: list[str]) -> tuple[dict[str, list[float]], dict[str, list[int]]]:
    """JCT curves (h, sorted) and per-job preemption counts of every policy in earlier --dump
    files; a label seen in an earlier file gets the file's name, so two runs of `ours` both show."""
    curves: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    for name in names:
        for label, rows in json.loads(Path(name).read_text())["policies"].items():
            key = f"{label} ({Path(name).stem})" if label in curves else label
            # rows: [id, team, gpus, arrival, first_start, finish, ..., preemptions, class] (_outcomes)
            curves[key] = sorted((float(r[5]) - float(r[3])) / 3600 for r in rows if float(r[5]) >= 0)
            counts[key] = [int(r[8]) for r in rows]
    return curves, counts


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def jain(xs: list[float]) -> float:
    """Jain's index (sum x)^2 / (n sum x^2): 1 = perfectly equal, 1/n = one team takes all."""
    xs = [x for x in xs if x == x]
    if not xs:
        return float("nan")
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


def service_jain(sim: Sim, start: float, stop: float) -> float:
    """Jain's index in its original form (Jain, Chiu, Hawe 1984): x = a team's allocation over its
    fair allocation. Over [start, stop], the fair allocation at each instant is the max-min
    (water-filling) split of all GPUs among teams by demand (GPUs of their arrived, unfinished
    jobs); x = GPU-seconds received / fair GPU-seconds. It asks "did each team get its share",
    which is what fair share promises; a team that takes more than its share also lowers it.
    """
    capacity = sum(n.gpu_count for n in sim.trace.nodes)
    ev: list[tuple[float, int, int, int]] = []  # (time, team, demand delta, allocation delta)
    for j in sim.trace.jobs:
        st = sim.stats[j.id]
        ev.append((j.arrival, j.team, j.gpu_count, 0))
        ev.append((st.finish if st.finish is not None else stop, j.team, -j.gpu_count, 0))
    for s, e, g, _, team in sim.attempts:
        ev.append((s, team, 0, g))
        ev.append((e, team, 0, -g))
    ev.sort()
    demand: dict[int, int] = defaultdict(int)
    alloc: dict[int, int] = defaultdict(int)
    got: dict[int, float] = defaultdict(float)
    fair: dict[int, float] = defaultdict(float)
    prev = start
    for t, team, dd, da in ev:
        lo, hi = max(prev, start), min(t, stop)
        if hi > lo:
            dt = hi - lo
            left, want = float(capacity), sorted((d, k) for k, d in demand.items() if d > 0)
            for i, (d, k) in enumerate(want):
                share = min(float(d), left / (len(want) - i))
                fair[k] += share * dt
                left -= share
            for k, a in alloc.items():
                got[k] += a * dt
        prev = max(prev, t)
        demand[team] += dd
        alloc[team] += da
    return jain([got[k] / f for k, f in fair.items() if f > 0])


def metrics(sim: Sim) -> dict[str, float | str]:
    trace = sim.trace
    jct, qdelay, bsld_by_team = [], [], defaultdict(list)
    worst: dict[str, float] = defaultdict(float)
    first = min(j.arrival for j in trace.jobs)
    last_arrival = max(j.arrival for j in trace.jobs)
    # Utilization over the arrival window: after the last arrival every policy just drains the
    # long tail, which would dilute the comparison.
    busy = work = 0.0
    for s, e, g, speed, _ in sim.attempts:
        gpu_s = max(0.0, min(e, last_arrival) - max(s, first)) * g
        busy += gpu_s
        work += gpu_s * speed
    # Normalized: useful work in fastest-type GPU-seconds over the fleet's capacity in the same
    # unit (each type weighted by its average speed), so running slowly does not look "busy".
    norm_capacity = sum(n.gpu_count * trace.speed.get(n.gpu_type, 1.0) for n in trace.nodes)
    for j in trace.jobs:
        st = sim.stats[j.id]
        if st.finish is None:
            continue
        c = st.finish - j.arrival
        wait = c - st.run_seconds
        jct.append(c)
        qdelay.append(wait)
        worst[j.priority_class] = max(worst[j.priority_class], wait)
        ideal = min(j.duration.values())
        # Bounded slowdown: short jobs' ratios are bounded by a 10-minute floor.
        bsld_by_team[j.team].append(max(1.0, c / max(ideal, 600.0)))
    capacity = sum(n.gpu_count for n in trace.nodes) * (last_arrival - first)
    out: dict[str, float | str] = {
        "avg_jct_h": statistics.fmean(jct) / 3600,
        "median_jct_h": _pct(jct, 0.5) / 3600,
        "p99_jct_h": _pct(jct, 0.99) / 3600,
        "avg_queue_h": statistics.fmean(qdelay) / 3600,
        "util": busy / capacity if capacity else float("nan"),
        "norm_util": work / (norm_capacity * (last_arrival - first)) if capacity else float("nan"),
        "jain": jain([statistics.fmean(v) for v in bsld_by_team.values()]),
        "jain_service": service_jain(sim, first, last_arrival),
        "preemptions": float(sim.preemptions),
        "unfinished": float(sum(1 for st in sim.stats.values() if st.finish is None)),
    }
    for cls in ("production", "premium", "standard", "batch", "interactive"):
        out[f"worst_wait_{cls}_h"] = worst.get(cls, 0.0) / 3600
    return out


POLICIES: list[tuple[str, Config]] = [
    ("FIFO", Config(policy="fifo")),
    ("FIFO+EASY", Config(policy="fifo_backfill")),
    ("ours", Config(policy="fair")),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", choices=("philly", "alibaba"), required=True)
    ap.add_argument("--limit", type=int, default=None, help="first N jobs by arrival")
    ap.add_argument("--skip", type=int, default=0, help="philly: drop the first N jobs by arrival")
    ap.add_argument("--vcs", default=None, help="philly: comma-separated VC names (default all 15)")
    ap.add_argument("--load", type=float, default=0.8, help="offered load used to size the fleet")
    ap.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the requested-wall factors, wall = duration x U(1, 3) (one draw per trace row)",
    )
    ap.add_argument("--gpus-per-type", type=int, default=None, help="philly: override the fleet size")
    ap.add_argument("--full-fleet", action="store_true", help="alibaba: all listed nodes (no contention)")
    ap.add_argument("--policies", default="FIFO,FIFO+EASY,ours")
    ap.add_argument(
        "--restart-seconds",
        type=float,
        default=0.0,
        help="each resumption after a preemption runs this long before it makes progress "
        "(checkpoint restore, reload); 0 = free restarts, which flatters preemption",
    )
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--plot", default=None, help="write a JCT CDF per policy as PNG here (matplotlib)")
    ap.add_argument(
        "--from-dumps",
        default=None,
        metavar="A.json,B.json",
        help="with --plot / --plot-preemptions: draw from earlier --dump files (split runs) "
        "instead of simulating",
    )
    ap.add_argument(
        "--plot-preemptions",
        default=None,
        help="write jobs preempted at least k times against k, per policy, as PNG here",
    )
    ap.add_argument("--dump", default=None, help="write per-job outcomes of every policy as JSON here")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a Config field of 'ours' (e.g. --set size_weight=0.6), for tuning runs",
    )
    args = ap.parse_args()
    known = [label for label, _ in POLICIES]
    if unknown := [label for label in args.policies.split(",") if label not in known]:
        ap.error(f"--policies: unknown {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    if not args.restart_seconds >= 0:  # also NaN
        ap.error(f"--restart-seconds must be >= 0, got {args.restart_seconds}")
    if args.from_dumps and (args.plot or args.plot_preemptions):
        curves_from, counts_from = _from_dumps(args.from_dumps.split(","))
        n_jobs = max(len(v) for v in counts_from.values())
        if args.plot:
            plot_cdf(Path(args.plot), f"{args.trace}: {n_jobs:,} jobs", curves_from)
        if args.plot_preemptions:
            plot_preemptions(Path(args.plot_preemptions), f"{args.trace}: {n_jobs:,} jobs", counts_from)
        return
    if args.trace == "philly":
        trace = load_philly(
            limit=args.limit,
            skip=args.skip,
            vcs=args.vcs.split(",") if args.vcs else None,
            load=args.load,
            gpus_per_type=args.gpus_per_type,
            seed=args.seed,
        )
    else:
        trace = load_alibaba(limit=args.limit, load=None if args.full_fleet else args.load, seed=args.seed)
    for note in trace.notes:
        print("#", note)
    wanted = args.policies.split(",")
    overrides: dict[str, object] = {}
    for item in args.set:
        key, value = item.split("=", 1)
        current = getattr(Config(), key)
        overrides[key] = (
            value.lower() in ("1", "true", "yes") if isinstance(current, bool) else type(current)(value)
        )
    if overrides:
        print("# ours overrides:", overrides)
    if args.restart_seconds:
        print(f"# each restart after a preemption costs {args.restart_seconds:.0f} s of no progress")
    results: list[tuple[str, dict[str, float | str], float]] = []
    dumps: dict[str, list[list[float | str]]] = {}
    curves: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    title = f"{trace.name}: {len(trace.jobs):,} jobs, {sum(n.gpu_count for n in trace.nodes)} GPUs"
    for label, cfg in POLICIES:
        if label not in wanted:
            continue
        if label == "ours" and overrides:
            cfg = replace(cfg, **overrides)  # type: ignore[arg-type]
        sim = Sim(trace, cfg, label, restart_seconds=args.restart_seconds)
        t0 = time.process_time()
        sim.run(progress=not args.quiet)
        cpu = time.process_time() - t0
        print(f"  [{label}] {sim.passes} passes in {cpu:.1f}s CPU", file=sys.stderr)
        m = metrics(sim)
        results.append((label, m, cpu))
        if args.dump:
            dumps[label] = _outcomes(sim)
        curves[label] = sorted(
            (st.finish - j.arrival) / 3600 for j in trace.jobs if (st := sim.stats[j.id]).finish is not None
        )
        counts[label] = [sim.stats[j.id].preempted for j in trace.jobs]
        # Long runs: each policy's headline numbers as soon as it is done.
        print(
            f"  [{label}] avg JCT {float(m['avg_jct_h']):.2f} h, queue {float(m['avg_queue_h']):.2f} h, "
            f"busy {float(m['util']):.3f}, normalized {float(m['norm_util']):.3f}, "
            f"Jain {float(m['jain']):.3f}",
            file=sys.stderr,
            flush=True,
        )
    if args.plot:
        plot_cdf(Path(args.plot), title, curves)
    if args.plot_preemptions:
        plot_preemptions(Path(args.plot_preemptions), title, counts)
    if args.dump:
        Path(args.dump).write_text(json.dumps({"trace": trace.name, "policies": dumps}))
    rows = [
        ("avg JCT (h)", "avg_jct_h", "{:.2f}"),
        ("median JCT (h)", "median_jct_h", "{:.2f}"),
        ("p99 JCT (h)", "p99_jct_h", "{:.1f}"),
        ("avg queueing delay (h)", "avg_queue_h", "{:.2f}"),
        ("GPU busy fraction (arrival window)", "util", "{:.3f}"),
        ("speed-normalized utilization", "norm_util", "{:.3f}"),
        ("Jain (team avg bounded slowdown)", "jain", "{:.3f}"),
        ("Jain (team GPU-time / fair share)", "jain_service", "{:.3f}"),
        ("preemptions", "preemptions", "{:.0f}"),
        ("unfinished jobs", "unfinished", "{:.0f}"),
    ] + [
        (f"worst wait {c} (h)", f"worst_wait_{c}_h", "{:.1f}")
        for c in ("production", "premium", "standard", "batch", "interactive")
    ]
    head = f"{'metric':<34}" + "".join(f"{label:>12}" for label, _, _ in results)
    print(head)
    print("-" * len(head))
    for name, key, fmt in rows:
        print(f"{name:<34}" + "".join(f"{fmt.format(m[key]):>12}" for _, m, _ in results))
    print(f"{'replay CPU (s)':<34}" + "".join(f"{cpu:>12.1f}" for _, _, cpu in results))
    by = {label: m for label, m, _ in results}
    if all(k in by for k in ("FIFO", "FIFO+EASY", "ours")):
        o, f, b = by["ours"], by["FIFO"], by["FIFO+EASY"]
        print(
            f"ours/FIFO avg JCT = {float(o['avg_jct_h']) / float(f['avg_jct_h']):.2f} (target <= 0.5); "
            f"ours/FIFO+EASY = {float(o['avg_jct_h']) / float(b['avg_jct_h']):.2f} (target <= 0.8); "
            f"busy ours - FIFO+EASY = {float(o['util']) - float(b['util']):+.3f}, "
            f"normalized {float(o['norm_util']) - float(b['norm_util']):+.3f} (target >= 0); "
            f"Jain ours = {float(o['jain']):.3f} (target >= 0.9)"
        )


if __name__ == "__main__":
    main()
