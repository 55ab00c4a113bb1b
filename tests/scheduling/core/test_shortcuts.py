"""The pass's exact shortcuts change cost, never decisions: with them switched off the Result is equal.

Shortcuts checked here: `_Pass.nothing_can_start` (the rest of the queue waits once nothing can
start, reserve or preempt) and `preemption._dominated` (a victim search known to fail because an
easier one failed). Small fleets with many jobs and few victim searches per pass reach both often.
"""

from __future__ import annotations

from dataclasses import replace

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


def _without_shortcuts(s: Snapshot) -> Result:
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_Pass, "nothing_can_start", lambda self: False)
        m.setattr(preemption_module, "_dominated", lambda *args: False)
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
