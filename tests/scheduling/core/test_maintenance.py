"""Maintenance windows (Slurm's maintenance reservations): a node whose window is ahead takes only
jobs that end (by their max wall) before it starts; no reservation or preemption counts on it."""

from __future__ import annotations

from scheduling.core import Quotas, schedule
from scheduling.core import reasons as R
from tests.scheduling.core.helpers import job, node, running, snap

NOW = 10_000.0
WINDOW = NOW + 2 * 3600  # node 2's maintenance starts in two hours


def test_a_node_before_its_window_takes_only_jobs_that_end_in_time() -> None:
    nodes = [node(1, free=()), node(2, available_until=WINDOW)]  # node 1 is full
    run = [running(50, ((1, tuple(range(8))),), cls="production", preemptible=False, started=NOW - 100,
                   wall=8 * 3600)]
    pending = [
        job(1, gpus=4, wall=3 * 3600, submitted=1.0),  # would run into the window
        job(2, gpus=4, wall=3600, submitted=2.0),
        job(3, gpus=4, wall=2 * 3600, submitted=3.0),  # ends exactly when the window starts
    ]
    res = schedule(snap(nodes, pending, run, now=NOW))
    assert sorted((p.job_id, p.allocations[0][0], p.reason_code, p.backfilled) for p in res.placements) == [
        (2, 2, R.BACKFILLED, True), (3, 2, R.BACKFILLED, True),
    ]
    assert res.wait_reasons == {1: R.RESOURCES}
    # The shorter jobs came first (size); job 2's reservation, on node 1, went when it was placed
    # on node 2; job 1 gets the next pass's. Whatever is reserved, node 2 is never counted on.
    assert all(n == 1 for r in res.reservations for n, _ in r.allocations)
    res = schedule(snap(nodes, [pending[0]], run, now=NOW))
    [reservation] = res.reservations
    assert reservation.job_id == 1 and {n for n, _ in reservation.allocations} == {1}
    assert reservation.start_at == NOW - 100 + 8 * 3600  # when job 50 reaches its wall, on node 1


def test_a_window_beyond_every_pending_run_constrains_nothing() -> None:
    far = node(2, available_until=NOW + 30 * 86_400)
    res = schedule(snap([far], [job(1, gpus=8, wall=7 * 86_400)], now=NOW))
    assert [(p.job_id, p.reason_code, p.backfilled) for p in res.placements] == [(1, R.PLACED, False)]


def test_best_fit_across_nodes_before_their_windows_and_regions_honoured() -> None:
    nodes = [
        node(1, available_until=WINDOW, free=range(6), region="eu"),  # 6 free
        node(2, available_until=WINDOW, free=range(3), region="eu"),  # 3 free: the tightest for 2
        node(3, available_until=WINDOW, region="us"),
    ]
    pending = [job(1, gpus=2, wall=600, regions=("eu",), submitted=1.0),
               job(2, gpus=8, wall=600, regions=("eu",), submitted=2.0)]  # no eu node has 8 free
    res = schedule(snap(nodes, pending, now=NOW))
    assert [(p.job_id, p.allocations) for p in res.placements] == [(1, ((2, (0, 1)),))]
    assert res.wait_reasons == {2: R.RESOURCES}


def test_quota_budget_and_victims_already_signalled_are_respected() -> None:
    nodes = [node(1, free=()), node(2, available_until=WINDOW)]
    run = [running(50, ((1, tuple(range(8))),), cls="production", started=NOW - 100, wall=8 * 3600,
                   org_id=1, project_id=10, preemptible=False)]
    pending = [
        job(1, gpus=4, wall=600, submitted=1.0, budget_ok=False, gpu_types=("H100",)),
        job(2, gpus=4, wall=600, submitted=2.0, org_id=1, gpu_types=("H100",)),  # org 1: 8 of 8 in use
        job(3, gpus=4, wall=600, submitted=3.0, org_id=3, project_id=30, gpu_types=("H100",)),
        job(4, gpus=4, wall=8 * 3600, submitted=4.0, org_id=3, project_id=30, gpu_types=("H100",)),
    ]
    res = schedule(snap(nodes, pending, run, quotas=Quotas(org={(1, "H100"): 8}), now=NOW))
    assert [p.job_id for p in res.placements] == [3]
    assert res.wait_reasons[1] == R.BUDGET and res.wait_reasons[2] == R.QUOTA


def test_a_window_already_begun_takes_nothing() -> None:
    res = schedule(snap([node(1, available_until=NOW - 1)], [job(1, gpus=1, wall=60)], now=NOW))
    assert res.placements == [] and res.wait_reasons == {1: R.RESOURCES}


def test_no_policy_places_a_job_that_would_run_into_the_window() -> None:
    for policy in ("fifo", "fifo_backfill", "fair"):
        res = schedule(snap([node(1, available_until=WINDOW)], [job(1, gpus=1, wall=3 * 3600)], now=NOW,
                            policy=policy))
        assert res.placements == [], policy
