"""`PendingJob.max_price`: while a top-up of its hold for a dearer type stands refused, a job is
placed only on the types its hold covers (adapter/repricing.py), and waits `budget` if none."""

from __future__ import annotations

from scheduling.core import reasons as R
from scheduling.core import schedule
from tests.scheduling.core.helpers import TYPES, job, node, running, snap

A100 = TYPES["A100"].price_per_gpu_hour_micro  # H100 costs more


def test_a_capped_job_skips_its_dearer_first_choice_for_a_covered_type() -> None:
    nodes = [node(1, "H100"), node(2, "A100")]
    pending = [job(1, gpus=2, gpu_types=("H100", "A100"), max_price=A100)]
    [place] = schedule(snap(nodes, pending)).placements
    assert (place.gpu_type, place.rate_micro_per_gpu_hour) == ("A100", A100)
    uncapped = [job(1, gpus=2, gpu_types=("H100", "A100"))]
    assert schedule(snap(nodes, uncapped)).placements[0].gpu_type == "H100"


def test_a_job_whose_hold_covers_none_of_its_types_waits_budget() -> None:
    res = schedule(snap([node(1, "H100"), node(2, "A100")],
                        [job(1, gpu_types=("H100", "A100"), max_price=A100 - 1), job(2, gpus=8)]))
    assert res.wait_reasons == {1: R.BUDGET}
    [skip] = res.skips
    assert f"covers up to {A100 - 1} per GPU-hour" in skip.detail
    assert [p.job_id for p in res.placements] == [2]  # the rest of the queue goes on


def test_a_capped_job_reserves_only_on_covered_types() -> None:
    # Both nodes busy: its reservation is on A100, though H100 would free first.
    nodes = [node(1, "H100", free=()), node(2, "A100", free=())]
    run = [running(90, ((1, tuple(range(8))),), wall=1000.0, started=9_500.0),
           running(91, ((2, tuple(range(8))),), wall=5000.0, started=9_500.0, gpu_type="A100")]
    res = schedule(snap(nodes, [job(1, gpus=8, gpu_types=("H100", "A100"), max_price=A100)], run))
    assert [(r.job_id, r.gpu_type) for r in res.reservations] == [(1, "A100")]

