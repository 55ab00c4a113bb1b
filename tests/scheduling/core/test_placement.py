"""Gang placement, GPU-type preference, memory floor, quotas, node states, reason codes."""

from __future__ import annotations

import pytest

from scheduling.core import Config, Quotas, schedule
from scheduling.core import reasons as R
from tests.scheduling.core.helpers import job, node, running, snap


def test_gang_never_starts_partially() -> None:
    # 6 free GPUs spread over two nodes: a 4-GPU gang fits one node, a 6-GPU gang fits none.
    s = snap([node(1, free=[0, 1, 2]), node(2, free=[0, 1, 2])], [job(1, gpus=6)])
    res = schedule(s)
    assert res.placements == []
    assert res.wait_reasons[1] == R.RESOURCES


def test_single_node_gang_gets_all_gpus_on_one_node() -> None:
    res = schedule(snap([node(1, free=[0, 1, 2]), node(2, free=range(8))], [job(1, gpus=4)]))
    (p,) = res.placements
    assert len(p.allocations) == 1 and p.allocations[0][0] == 2 and len(p.allocations[0][1]) == 4


def test_best_fit_prefers_tightest_node() -> None:
    nodes = [node(1, free=range(8)), node(2, free=[4, 5]), node(3, free=[0, 1, 2])]
    res = schedule(snap(nodes, [job(1, gpus=2)]))
    assert res.placements[0].allocations == ((2, (4, 5)),)


def test_multi_node_gang_only_within_one_ib_group() -> None:
    # 16 GPUs free in total, but 8 in group a and 8 in group b: must not start across groups.
    nodes = [node(1, ib_group="a"), node(2, ib_group="b")]
    res = schedule(snap(nodes, [job(1, gpus=16)]))
    assert res.placements == []
    nodes.append(node(3, ib_group="a"))
    res = schedule(snap(nodes, [job(1, gpus=16)]))
    (p,) = res.placements
    assert {nid for nid, _ in p.allocations} == {1, 3}
    assert sum(len(i) for _, i in p.allocations) == 16


def test_multi_node_gang_prefers_same_nvlink_domain() -> None:
    nodes = [
        node(1, ib_group="a", nvlink_domain="x"),
        node(2, ib_group="a", nvlink_domain="y"),
        node(3, ib_group="a", nvlink_domain="y"),
    ]
    (p,) = schedule(snap(nodes, [job(1, gpus=16)])).placements
    assert {nid for nid, _ in p.allocations} == {2, 3}


def test_gpu_type_preference_in_order() -> None:
    nodes = [node(1, "T4"), node(2, "A100"), node(3, "H100")]
    (p,) = schedule(snap(nodes, [job(1, gpus=8, gpu_types=("A100", "H100"))])).placements
    assert p.gpu_type == "A100"
    busy_a100 = [node(1, "T4"), node(2, "A100", free=[]), node(3, "H100")]
    (p,) = schedule(snap(busy_a100, [job(1, gpus=8, gpu_types=("A100", "H100"))])).placements
    assert p.gpu_type == "H100"


def test_any_type_means_cheapest_first_and_rate_is_fixed_from_type() -> None:
    (p,) = schedule(snap([node(1, "H100"), node(2, "T4")], [job(1)])).placements
    assert p.gpu_type == "T4" and p.rate_micro_per_gpu_hour == 350_000


def test_memory_floor_respected() -> None:
    nodes = [node(1, "T4"), node(2, "A100", free=[])]
    res = schedule(snap(nodes, [job(1, gpu_memory_gb=40)]))
    assert res.placements == [] and res.wait_reasons[1] == R.RESOURCES
    res = schedule(snap(nodes, [job(1, gpu_memory_gb=100)]))
    assert res.wait_reasons[1] == R.NO_MATCHING_GPU_TYPE


def test_quota_per_org_and_project_per_type() -> None:
    nodes = [node(1, "H100"), node(2, "T4")]
    run = [running(9, ((1, (0, 1, 2, 3)),), org_id=1, project_id=10)]
    q = Quotas(org={(1, "H100"): 6})
    res = schedule(snap(nodes, [job(1, gpus=4, gpu_types=("H100",))], run, quotas=q))
    assert res.wait_reasons[1] == R.QUOTA
    # Job 9 is past its max wall (ended by 3600, now is 10,000): the quota is reserved from now.
    assert res.skips[0].detail == (
        "concurrent-GPU quota: H100 org 4 of 6 in use; needs 4; quota reserved for it from "
        "1970-01-01T02:46:40Z on H100"
    )
    # Falls through to a type where quota allows.
    res = schedule(snap(nodes, [job(1, gpus=4, gpu_types=("H100", "T4"))], run, quotas=q))
    assert res.placements[0].gpu_type == "T4"
    qp = Quotas(project={(10, "T4"): 5})
    res = schedule(
        snap(nodes, [job(1, gpus=4, gpu_types=("T4",)), job(2, gpus=4, gpu_types=("T4",))], quotas=qp)
    )
    assert [p.job_id for p in res.placements] == [1] and res.wait_reasons[2] == R.QUOTA
    # Job 2 has the quota reserved from when job 1, placed now (10,000), reaches its max wall.
    assert res.skips[0].detail == (
        "concurrent-GPU quota: T4 project 4 of 5 in use; needs 4; quota reserved for it from "
        "1970-01-01T03:46:40Z on T4"
    )


def test_draining_unknown_down_nodes_get_nothing() -> None:
    nodes = [node(1, state="draining"), node(2, state="unknown"), node(3, state="down")]
    res = schedule(snap(nodes, [job(1)]))
    assert res.placements == [] and res.wait_reasons[1] == R.RESOURCES


def test_budget_and_every_job_gets_a_reason() -> None:
    res = schedule(snap([node(1, free=[])], [job(1, budget_ok=False), job(2)]))
    assert res.wait_reasons == {1: R.BUDGET, 2: R.RESOURCES}


def test_region_constraint() -> None:
    nodes = [node(1, region="eu"), node(2, region="us")]
    (p,) = schedule(snap(nodes, [job(1, regions=("us",))])).placements
    assert p.allocations[0][0] == 2


def test_fifo_policy_blocks_behind_head() -> None:
    s = snap(
        [node(1, free=[0, 1])], [job(1, gpus=4, submitted=0), job(2, gpus=1, submitted=1)], policy="fifo"
    )
    res = schedule(s)
    assert res.placements == [] and res.wait_reasons == {1: R.RESOURCES, 2: R.PRIORITY}


def test_ski_rental_waits_for_faster_type_then_takes_slower() -> None:
    # H100 busy; T4 free but 5x slower for this job. Fresh: wait. After waiting longer than the
    # extra run time T4 would cost (x factor), take T4.
    nodes = [node(1, "H100", free=[]), node(2, "T4")]
    walls = (("H100", 3600.0), ("T4", 18_000.0))
    fresh = job(1, gpu_types=("H100", "T4"), max_wall_by_type=walls, submitted=10_000.0)
    res = schedule(snap(nodes, [fresh], now=10_000.0, slow_type_wait_factor=0.5))
    assert res.placements == [] and res.wait_reasons[1] == R.RESOURCES
    old = job(1, gpu_types=("H100", "T4"), max_wall_by_type=walls, submitted=10_000.0 - 7_300.0)
    (p,) = schedule(snap(nodes, [old], now=10_000.0, slow_type_wait_factor=0.5)).placements
    assert p.gpu_type == "T4" and p.max_wall_seconds == 18_000.0
    # Baselines and factor 0 always take the first type that fits.
    (p,) = schedule(snap(nodes, [fresh], now=10_000.0, policy="fifo_backfill")).placements
    assert p.gpu_type == "T4"


def test_ski_rental_takes_slower_type_when_fast_queue_is_long() -> None:
    # Three fresh jobs want H100 (busy); T4 costs each +4 h. Ahead of job 3 already wait
    # 2 x 8 GPUs x 5 h of H100 work on 8 H100s = 10 h > 4 h: job 3 goes to T4 now.
    nodes = [node(1, "H100", free=[]), node(2, "T4", gpus=1)]
    walls = (("H100", 5 * 3600.0), ("T4", 9 * 3600.0))
    big = (("H100", 5 * 3600.0), ("T4", 99 * 3600.0))
    pending = [
        job(1, gpus=8, gpu_types=("H100", "T4"), max_wall_by_type=big, submitted=10_000.0),
        job(2, gpus=8, gpu_types=("H100", "T4"), max_wall_by_type=big, submitted=10_000.0),
        job(3, gpus=1, gpu_types=("H100", "T4"), max_wall_by_type=walls, submitted=10_000.0, cls="batch"),
    ]
    res = schedule(snap(nodes, pending, now=10_000.0, slow_type_wait_factor=0.5))
    assert [(p.job_id, p.gpu_type) for p in res.placements] == [(3, "T4")]


# -- end_time_packing -----------------------------------------------------------------------------
H = 3600.0
NOW = 10_000.0


def _two_half_busy_nodes(first_wall: float, second_wall: float) -> tuple[list, list]:
    """Nodes 1 and 2, 4 of 8 GPUs busy on each, their jobs ending in `first_wall` / `second_wall`."""
    nodes = [node(1), node(2)]
    run = [
        running(50, ((1, (0, 1, 2, 3)),), started=NOW, wall=first_wall),
        running(51, ((2, (0, 1, 2, 3)),), started=NOW, wall=second_wall),
    ]
    return nodes, run


@pytest.mark.parametrize(
    ("first_ends", "second_ends", "wall"),
    [
        pytest.param(1 * H, 100 * H, 90 * H, id="long-job-beside-long-jobs"),  # node 1 drains soon
        pytest.param(100 * H, 1 * H, 1 * H, id="short-job-beside-short-jobs"),  # node 2 drains soon
    ],
)
def test_end_time_packing_places_job_beside_jobs_ending_alike(
    first_ends: float, second_ends: float, wall: float
) -> None:
    nodes, run = _two_half_busy_nodes(first_ends, second_ends)
    pending = [job(1, wall=wall)]
    # Off: plain tightest fit, equal free counts, first node.
    (p,) = schedule(snap(nodes, pending, run, now=NOW)).placements
    assert p.allocations[0][0] == 1
    for mode in ("tightest", "partial"):
        (p,) = schedule(snap(nodes, pending, run, now=NOW, end_time_packing=mode)).placements
        assert p.allocations[0][0] == 2, mode


def test_end_time_packing_partial_looks_past_the_tightest_node_but_not_at_idle_ones() -> None:
    # Node 1: 2 free, its job ends in 1 h. Node 2: 4 free, its job runs 100 h. Node 3: idle.
    nodes = [node(1), node(2), node(3)]
    run = [
        running(50, ((1, (0, 1, 2, 3, 4, 5)),), started=NOW, wall=1 * H),
        running(51, ((2, (0, 1, 2, 3)),), started=NOW, wall=100 * H),
    ]
    long_job = [job(1, wall=100 * H)]
    for mode in ("off", "tightest"):  # tightest fit first: node 1
        (p,) = schedule(snap(nodes, long_job, run, now=NOW, end_time_packing=mode)).placements
        assert p.allocations[0][0] == 1, mode
    (p,) = schedule(snap(nodes, long_job, run, now=NOW, end_time_packing="partial")).placements
    assert p.allocations[0][0] == 2
    # A short job goes to node 1 (closest end), never to the idle node 3 (whose end is "now").
    (p,) = schedule(snap(nodes, [job(1, wall=60.0)], run, now=NOW, end_time_packing="partial")).placements
    assert p.allocations[0][0] == 1
    # With no busy node fitting, the tightest idle node is used.
    (p,) = schedule(snap(nodes, [job(1, gpus=8)], run, now=NOW, end_time_packing="partial")).placements
    assert p.allocations[0][0] == 3


def test_end_time_packing_counts_jobs_placed_earlier_in_the_same_pass() -> None:
    # Both nodes' jobs end in 1 h; node 1 is tighter. The long premium job goes first (tightest),
    # which makes node 1 a 100 h node: the short job after it goes to node 2.
    nodes = [node(1), node(2)]
    run = [
        running(50, ((1, (0, 1, 2, 3, 4)),), started=NOW, wall=1 * H),
        running(51, ((2, (0, 1, 2, 3)),), started=NOW, wall=1 * H),
    ]
    pending = [job(1, cls="premium", wall=100 * H), job(2, wall=1 * H)]
    res = schedule(snap(nodes, pending, run, now=NOW, end_time_packing="partial"))
    assert {p.job_id: p.allocations[0][0] for p in res.placements} == {1: 1, 2: 2}
    res = schedule(snap(nodes, pending, run, now=NOW))
    assert {p.job_id: p.allocations[0][0] for p in res.placements} == {1: 1, 2: 1}


def test_end_time_packing_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="end_time_packing"):
        Config(end_time_packing="longest")
