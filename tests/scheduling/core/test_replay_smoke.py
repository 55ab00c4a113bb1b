"""The trace replay on a tiny generated trace: every policy finishes every job, nothing overlaps."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from scheduling.core import DEFAULT_PRIORITY_CLASSES, Config, GpuType, Node, PriorityClass

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import _traces
from _traces import Trace, TraceJob, load_alibaba, load_philly
from replay import Sim, _from_dumps, _outcomes, jain, metrics, plot_preemptions


def _tiny_trace(n_jobs: int = 120, seed: int = 3) -> Trace:
    rng = random.Random(seed)
    types = {"H100": GpuType("H100", 80, 3_000_000), "T4": GpuType("T4", 16, 500_000)}
    nodes = [
        Node(i, "H100" if i < 2 else "T4", 8, frozenset(range(8)), "r0", f"nv{i}", f"ib{i // 2}")
        for i in range(4)
    ]
    classes = ("production", "premium", "standard", "batch", "interactive")
    jobs = []
    for k in range(n_jobs):
        d = rng.uniform(600, 20_000)
        jobs.append(
            TraceJob(
                id=k + 1,
                team=k % 3,
                user=k % 2,
                arrival=k * 300.0,
                gpu_count=rng.choice((1, 1, 2, 4, 8, 16)),
                duration={"H100": d, "T4": 4 * d},
                priority_class=rng.choice(classes),
                wall_factor=rng.uniform(1, 3),
            )
        )
    return Trace("tiny", jobs, ["a", "b", "c"], types, nodes, [], {"H100": 1.0, "T4": 0.25})


def test_every_policy_finishes_every_job() -> None:
    trace = _tiny_trace()
    for policy in ("fifo", "fifo_backfill", "fair"):
        sim = Sim(trace, Config(policy=policy), policy)
        sim.run(progress=False)  # asserts internally that no GPU is allocated twice
        m = metrics(sim)
        assert m["unfinished"] == 0
        assert all(
            st.finish is not None and st.finish >= j.arrival for j in trace.jobs for st in [sim.stats[j.id]]
        )
        assert 0 < float(m["util"]) <= 1.0


def test_trace_jobs_take_their_class_policy_as_their_own_preemptible_flag() -> None:
    """The core decides by the job's flag alone; the replay sets it from the class, as submission
    does for a client that does not choose. With premium made non-preemptible (a non-preemptible
    class below production), no premium job is ever stopped while others are."""
    ladder = tuple(
        PriorityClass(c.name, c.rank, c.name not in ("production", "premium"), c.can_preempt)
        for c in DEFAULT_PRIORITY_CLASSES
    )
    trace = _tiny_trace()
    sim = Sim(trace, Config(policy="fair", priority_classes=ladder), "ours")
    sim.run(progress=False)
    stopped = {cls: 0 for cls in ("production", "premium", "standard", "batch", "interactive")}
    for j in trace.jobs:
        stopped[j.priority_class] += sim.stats[j.id].preempted
    assert stopped["premium"] == stopped["production"] == 0 and sim.preemptions > 0


def test_jain_index() -> None:
    assert jain([2.0, 2.0, 2.0]) == 1.0
    assert abs(jain([1.0, 0.0, 0.0, 0.0]) - 0.25) < 1e-12


def _write_tiny_trace_files(root: Path, n_jobs: int = 40) -> None:
    """Both traces' file formats, a few dozen rows each (the real ones live outside the repo)."""
    philly = root / "philly-gavel"
    (philly / "seed0").mkdir(parents=True)
    speeds = (("k80", 1.0), ("p100", 2.0), ("v100", 4.0))
    table = {gpu: {"('J', 1)": {"null": speed}} for gpu, speed in speeds}
    (philly / "simulation_throughputs.json").write_text(json.dumps(table))
    for vc in ("aaa", "bbb"):
        # name, command, flag, -, steps, arrival, gang size (tab-separated, as Gavel writes them)
        rows = [
            f"J\tcmd\t-step\t1\t{1000 + 37 * k}\t{60.0 * k + (vc == 'bbb')}\t1" for k in range(n_jobs // 2)
        ]
        (philly / "seed0" / f"{vc}.trace").write_text("\n".join(rows) + "\n")
    alibaba = root / "alibaba-openb"
    alibaba.mkdir()
    (alibaba / "openb_node_list_gpu_node.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,V100M32\nn1,64000,262144,8,T4\n"
    )
    head = (
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time"
    )
    pods = [f"p{k},1000,1024,1,1000,,LS,Running,{60 * k},{60 * k + 900},{60 * k}" for k in range(n_jobs)]
    (alibaba / "openb_pod_list_gpuspec33.csv").write_text("\n".join([head, *pods]) + "\n")


def test_seed_draws_other_wall_factors_and_a_window_keeps_the_full_traces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--seed` changes only the requested walls (duration x U(1, 3)); a `--skip` window draws
    the same factor per trace row as the full trace, whatever the seed."""
    _write_tiny_trace_files(tmp_path)
    monkeypatch.setattr(_traces, "TRACES", tmp_path)
    first = load_philly(seed=0)
    again = load_philly(seed=0)
    other = load_philly(seed=1)
    assert len(first.jobs) == 40
    assert [j.wall_factor for j in first.jobs] == [j.wall_factor for j in again.jobs]
    assert [j.wall_factor for j in first.jobs] != [j.wall_factor for j in other.jobs]
    assert [(j.arrival, j.gpu_count, j.duration) for j in first.jobs] == [
        (j.arrival, j.gpu_count, j.duration) for j in other.jobs
    ]
    window = load_philly(skip=10, limit=20, seed=1)
    assert [j.wall_factor for j in window.jobs] == [j.wall_factor for j in other.jobs[10:30]]
    a0, a1 = load_alibaba(seed=0), load_alibaba(seed=1)
    assert len(a0.jobs) == 40
    assert [j.wall_factor for j in a0.jobs] != [j.wall_factor for j in a1.jobs]
    assert all(1.0 <= j.wall_factor <= 3.0 for j in a0.jobs + a1.jobs)


def test_restart_after_preemption_costs_the_given_seconds() -> None:
    """A batch job preempted once by a production job finishes exactly R later with a restart
    cost of R; the preemptor is unaffected (it never resumes)."""
    types = {"H100": GpuType("H100", 80, 3_000_000)}
    nodes = [Node(0, "H100", 8, frozenset(range(8)), "r0", "nv0", "ib0")]
    jobs = [
        TraceJob(1, 0, 0, 0.0, 8, {"H100": 10_000.0}, "batch", 1.0),
        TraceJob(2, 1, 0, 1_000.0, 8, {"H100": 1_000.0}, "production", 1.0),
    ]
    trace = Trace("two", jobs, ["a", "b"], types, nodes, [], {"H100": 1.0})
    finish = {}
    for restart in (0.0, 300.0):
        sim = Sim(trace, Config(policy="fair"), "ours", restart_seconds=restart)
        sim.run(progress=False)
        assert sim.stats[1].preempted == 1 and sim.stats[2].preempted == 0
        finish[restart] = (sim.stats[1].finish, sim.stats[2].finish)
    # signalled at 1,000, exits after the 120 s grace with 1,120 s of progress kept
    assert finish[0.0] == (2_120.0 + 8_880.0, 2_120.0)
    assert finish[300.0] == (2_120.0 + 300.0 + 8_880.0, 2_120.0)



def test_dumps_of_two_runs_of_one_policy_both_plot(tmp_path: Path) -> None:
    """Split runs: the second file's `ours` is kept under the file's name, with its preemptions."""
    trace = _tiny_trace()
    sims = {}
    for name, growth in (("old-rule", 1.0), ("default", 2.0)):
        sim = Sim(trace, Config(policy="fair", preemption_exempt_growth=growth), "ours")
        sim.run(progress=False)
        sims[name] = sim
        dump = {"trace": "tiny", "policies": {"ours": _outcomes(sim)}}
        (tmp_path / f"{name}.json").write_text(json.dumps(dump))
    curves, counts = _from_dumps([str(tmp_path / "old-rule.json"), str(tmp_path / "default.json")])
    assert list(counts) == ["ours", "ours (default)"]
    assert counts["ours"] == [sims["old-rule"].stats[j.id].preempted for j in trace.jobs]
    assert sum(counts["ours (default)"]) == sims["default"].preemptions
    assert len(curves["ours"]) == len(trace.jobs)
    assert sum(counts["ours"]) > 0  # the tiny trace preempts, so there is a line to draw
    plot_preemptions(tmp_path / "p.png", "tiny", counts)
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
