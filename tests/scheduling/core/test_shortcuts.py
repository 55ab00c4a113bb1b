"""The pass's exact shortcuts change cost, never decisions: with them switched off the Result is equal.

Shortcuts checked here: `_Pass.nothing_can_start` (the rest of the queue waits once nothing can
start, reserve or preempt), `preemption._dominated` (a victim search known to fail because an
easier one failed), and two per-pass caches: which reservation holds the GPUs a gang would need
(`_Pass._holder`) and the smallest gang whose victim search failed (`_Pass.preempt_fail_min`).
Small fleets with many jobs and few victim searches per pass reach them often.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core import Result, Snapshot, schedule
from scheduling.core import preemption as preemption_module
from scheduling.core.scheduler import _Pass
from tests.scheduling.core.helpers import job, node, running, snap
from tests.scheduling.core.test_properties import snapshots


@st.composite
def tight_snapshots(draw: st.DrawFn) -> Snapshot:
    s = draw(snapshots())
    cfg = replace(
        s.config,
        max_preemption_attempts=draw(st.sampled_from((0, 1, 3, 64))),
        preemption_min_gain=draw(st.sampled_from((0.0, 1.0, 2.0))),
        max_reservations=draw(st.integers(1, 2)),
    )
    return replace(s, config=cfg)


@st.composite
def busy_snapshots(draw: st.DrawFn) -> Snapshot:
    """A full fleet of low-class running jobs and a queue of jobs that may preempt them."""
    nodes, run = [], []
    for nid in range(draw(st.integers(1, 4))):
        gpu_type = draw(st.sampled_from(("H100", "A100")))
        nodes.append(node(nid, gpu_type))
        left = list(range(8))
        while left:
            take = tuple(left[: draw(st.integers(1, len(left)))])
            left = left[len(take) :]
            jid = 1000 + len(run)
            run.append(
                running(
                    jid,
                    ((nid, take),),
                    cls=draw(st.sampled_from(("premium", "standard", "batch", "interactive"))),
                    started=draw(st.floats(0, 90_000)),
                    wall=draw(st.floats(10_000, 200_000)),
                    gpu_type=gpu_type,
                    preemptible=draw(st.booleans()) or draw(st.booleans()),
                    preemption_requested_at=draw(st.sampled_from((None, None, None, 99_990.0))),
                )
            )
    pending = [
        job(
            k,
            gpus=draw(st.sampled_from((1, 2, 4, 8))),
            cls=draw(st.sampled_from(("production", "premium", "standard", "batch"))),
            submitted=draw(st.floats(0, 100_000)),
            wall=draw(st.floats(600, 150_000)),
            gpu_types=tuple(draw(st.lists(st.sampled_from(("H100", "A100")), max_size=2, unique=True))),
            org_id=draw(st.integers(1, 3)),
        )
        for k in range(draw(st.integers(1, 30)))
    ]
    return snap(
        nodes,
        pending,
        run,
        now=100_000.0,
        min_runtime_before_preemption_seconds=0.0,
        max_preemption_attempts=draw(st.sampled_from((1, 4, 64))),
        preemption_min_gain=draw(st.sampled_from((0.0, 1.0, 2.0))),
    )


_reserved_holder, _try_preempt = _Pass.reserved_holder, _Pass.try_preempt


def _holder_uncached(self: _Pass, *args: Any) -> int | None:
    self._holder.clear()
    return _reserved_holder(self, *args)


def _preempt_uncached(self: _Pass, *args: Any) -> bool:
    self.preempt_fail_min.clear()
    return _try_preempt(self, *args)


def _without_shortcuts(s: Snapshot) -> Result:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_Pass, "nothing_can_start", lambda self: False)
        m.setattr(preemption_module, "_dominated", lambda *args: False)
        m.setattr(_Pass, "reserved_holder", _holder_uncached)
        m.setattr(_Pass, "try_preempt", _preempt_uncached)
        return schedule(s)


@settings(max_examples=400, deadline=None)
@given(st.one_of(tight_snapshots(), busy_snapshots()))
def test_shortcuts_do_not_change_the_result(s: Snapshot) -> None:
    assert schedule(s) == _without_shortcuts(s)


def test_nothing_can_start_settles_a_full_fleet() -> None:
    # One 8-GPU node, fully busy with a batch job; a queue of jobs that cannot preempt it
    # (interactive/batch) after the first one reserves: the pass settles, all wait `resources`.
    busy = running(900, ((1, tuple(range(8))),), cls="batch", started=0.0, wall=7200.0)
    pending = [job(k, gpus=1 + k % 4, cls="interactive", submitted=float(k)) for k in range(1, 30)]
    s = snap([node(1)], pending, [busy], now=100.0)
    p = _Pass(s)
    result = p.run()
    assert p._settled
    assert [d.reason_code for d in result.decisions] == ["resources"] * len(pending)
    assert len(result.reservations) == 1


def test_the_reservation_holder_is_not_read_from_before_a_placement() -> None:
    """Fuzz: job 3's placement shrank A100's free pool after job 2's holder lookup was cached, so
    job 4 was told `reserved-for-job-1` and never reserved H100; job 5 then took those GPUs."""
    nodes = [node(1, "A100", 8, free=(4, 5, 6, 7)), node(2, "H100", 4, free=(2, 3))]
    run = [running(901, ((1, (0, 1, 2, 3)),), gpu_type="A100", started=9_900.0, wall=5_100.0),
           running(902, ((2, (0, 1)),), gpu_type="H100", started=9_900.0, wall=1_100.0)]
    pending = [job(k, gpus=g, wall=50_000.0, submitted=float(k), gpu_types=types) for k, g, types in (
        (1, 6, ("A100",)), (2, 3, ("A100",)), (3, 2, ("A100",)), (4, 3, ("A100", "H100")), (5, 2, ("H100",)))]
    s = snap(nodes, pending, run, policy="fifo_backfill")
    res = schedule(s)
    assert res == _without_shortcuts(s)
    assert {r.job_id: r.gpu_type for r in res.reservations}.get(4) == "H100"
    assert res.wait_reasons[5] == "reserved-for-job-4"


def test_a_failed_single_node_victim_search_does_not_hide_a_multi_node_one() -> None:
    """Fuzz: no node could be freed for job 1's 3 GPUs, and that failure was taken to mean job 2's
    8-GPU gang could not be freed either, though four batch jobs free 2 GPUs each in IB group a."""
    nodes = [node(n, gpus=4, free=(), ib_group="a") for n in range(4)]
    run = [running(100 + n, ((n, (0, 1)),), cls="production", preemptible=False, started=5_000.0,
                   wall=80_000.0) for n in range(4)]
    run += [running(200 + n, ((n, (2, 3)),), started=5_000.0, wall=80_000.0) for n in range(4)]
    pending = [job(1, gpus=3, cls="premium", submitted=9_000.0),
               job(2, gpus=8, cls="premium", submitted=10_000.0)]
    s = snap(nodes, pending, run, preemption_min_gain=0.0, min_runtime_before_preemption_seconds=0.0)
    res = schedule(s)
    assert res == _without_shortcuts(s)
    assert sorted(p.job_id for p in res.preemptions if p.for_job_id == 2) == [200, 201, 202, 203]
