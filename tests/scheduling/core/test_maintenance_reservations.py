"""Reservations from a maintenance window's end (review of ccc5720): one on GPUs back from
maintenance only masks nothing, so it takes neither its type's EASY reservation nor one of the
pass's; its GPUs go to no other job; a GPU the node reports busy with no known job is never promised."""

from __future__ import annotations

from scheduling.core import Quotas, schedule
from scheduling.core import reasons as R
from tests.scheduling.core.helpers import job, node, running, snap

NOW = 10_000.0
BACK = NOW + 10 * 3600  # node 2's window ends in ten hours


def test_a_reservation_on_a_node_in_its_window_does_not_cost_the_ready_fleet_its_reservation() -> None:
    """Job 1 (8 GPUs) only fits node 2, inside its window until BACK. Job 2 (4 GPUs) fits the ready
    node 1 once job 50 ends in an hour. Before ccc5720 job 2 held the H100 reservation (node 1's two
    free GPUs masked), so job 3 (2 GPUs, 5 h) could not take them and delay it. Now job 1's
    reservation on node 2, which masks nothing and protects nothing in this pass (no job can be
    placed on a node in its window anyway), takes the type's only reservation: job 2 gets none and
    job 3 is backfilled onto the GPUs job 2 needs, delaying it by four hours."""
    nodes = [node(1, gpus=4, free=(2, 3)), node(2, state="draining", maintenance_ends=BACK)]
    run = [running(50, ((1, (0, 1)),), cls="production", preemptible=False, started=NOW, wall=3600)]
    pending = [job(1, gpus=8, wall=3600, submitted=1.0), job(2, gpus=4, wall=3600, submitted=2.0),
               job(3, gpus=2, wall=5 * 3600, submitted=3.0)]
    res = schedule(snap(nodes, pending, run, now=NOW, policy="fifo_backfill"))
    assert [p.job_id for p in res.placements] == [], "job 3 took the GPUs job 2 starts on in an hour"
    assert (2, NOW + 3600) in [(r.job_id, r.start_at) for r in res.reservations]


def test_a_reservation_on_a_node_in_its_window_does_not_use_up_the_passs_reservations() -> None:
    """Same harm across types: with max_reservations=1, the A100 job 1 that only node 2 (inside its
    window for ten hours) can hold takes the pass's only reservation, though it masks nothing.
    The H100 job 2, which starts on node 1 in an hour, loses the reservation it had before ccc5720,
    and job 3 is backfilled onto its GPUs for five hours."""
    nodes = [node(1, gpus=4, free=(2, 3)), node(2, "A100", state="draining", maintenance_ends=BACK)]
    run = [running(50, ((1, (0, 1)),), cls="production", preemptible=False, started=NOW, wall=3600)]
    pending = [job(1, gpus=8, wall=3600, gpu_types=("A100",), submitted=1.0),
               job(2, gpus=4, wall=3600, gpu_types=("H100",), submitted=2.0),
               job(3, gpus=2, wall=5 * 3600, gpu_types=("H100",), submitted=3.0)]
    res = schedule(snap(nodes, pending, run, now=NOW, policy="fifo_backfill", max_reservations=1))
    assert [p.job_id for p in res.placements] == [], "job 3 took the GPUs job 2 starts on in an hour"
    assert (2, NOW + 3600) in [(r.job_id, r.start_at) for r in res.reservations]


def test_a_gpu_the_node_in_its_window_reports_busy_is_not_promised() -> None:
    """FleetState trusts neither side alone: a GPU is free only if the node says so and no running
    allocation claims it; a ready node reporting GPU 0 busy (no job known there) never offers it,
    so no reservation counts on it (first case). `returning_releases` ignores `free_gpu_indices`
    and frees every GPU of a node back from its window at the window's end, so the same node inside
    its window is promised in full from BACK: a reservation the fleet cannot honour then (at BACK
    the node is ready with GPU 0 still reported busy, and the 8-GPU job does not fit it)."""
    ready = schedule(snap([node(1, free=range(1, 8))], [job(1, gpus=8, wall=3600)], now=NOW))
    assert ready.reservations == []
    res = schedule(snap([node(1, free=range(1, 8), state="draining", maintenance_ends=BACK)],
                        [job(1, gpus=8, wall=3600)], now=NOW))
    assert not any(0 in idx for r in res.reservations for n, idx in r.allocations), res.reservations
    after = schedule(snap([node(1, free=range(1, 8))], [job(1, gpus=8, wall=3600)], now=BACK))
    assert after.placements == []  # what the promise meets at BACK


def test_a_job_the_fill_places_before_a_window_leaves_the_type_without_a_reservation() -> None:
    """Node 2 (8 GPUs, idle) is held out for its window (NOW + 2 h to BACK); job 4 (8 GPUs, 10 h)
    makes it so. Job 1 (8 GPUs, 1 h) only fits node 2: the pass reserves it there from BACK, which
    takes the H100 reservation from job 2 (4 GPUs, node 1 frees in an hour), and then the fill
    places job 1 on node 2 before the window after all. Nothing is left reserved for job 2 (before
    ccc5720 it was), and job 3 is backfilled onto its GPUs for five hours."""
    nodes = [node(1, gpus=4, free=(2, 3)), node(2, available_until=NOW + 7200, maintenance_ends=BACK)]
    run = [running(50, ((1, (0, 1)),), cls="production", preemptible=False, started=NOW, wall=3600)]
    pending = [job(1, gpus=8, wall=3600, submitted=1.0), job(2, gpus=4, wall=3600, submitted=2.0),
               job(3, gpus=2, wall=5 * 3600, submitted=3.0), job(4, gpus=8, wall=10 * 3600, submitted=4.0)]
    res = schedule(snap(nodes, pending, run, now=NOW, policy="fifo_backfill"))
    assert 1 in [p.job_id for p in res.placements]  # on node 2, before its window
    assert 3 not in [p.job_id for p in res.placements], "job 3 took the GPUs job 2 starts on in an hour"
    assert (2, NOW + 3600) in [(r.job_id, r.start_at) for r in res.reservations]


def test_gpus_back_from_maintenance_are_promised_to_one_job_each() -> None:
    """Node 1 is inside its window until BACK. Jobs 1 and 2 (4 GPUs each) are both reserved from
    BACK on it, on different GPUs; job 3 finds every GPU of the node promised and gets none. None of
    these reservations holds the H100 reservation (`Result.reservation`): they mask nothing."""
    nodes = [node(1, state="draining", maintenance_ends=BACK)]
    pending = [job(1, gpus=4, submitted=1.0), job(2, gpus=4, submitted=2.0), job(3, gpus=4, submitted=3.0)]
    res = schedule(snap(nodes, pending, now=NOW, policy="fifo_backfill"))
    assert [(r.job_id, r.start_at, r.allocations, r.returning) for r in res.reservations] == [
        (1, BACK, ((1, (0, 1, 2, 3)),), True), (2, BACK, ((1, (4, 5, 6, 7)),), True)
    ]
    assert res.reservation is None
    assert res.wait_reasons == {1: R.RESOURCES, 2: R.RESOURCES, 3: R.RESOURCES}
    assert "reserved" not in res.skips[2].detail and "in-maintenance" in res.skips[2].detail


def test_a_reservation_on_gpus_back_from_maintenance_still_claims_its_quota_room() -> None:
    """Job 1 (8 GPUs) only fits node 2, in its window until BACK, and is reserved there; its org
    may run 8 H100 GPUs at once, and that room is claimed from BACK as for any reservation: job 2
    of the same org, which would still run on node 1 then, waits for it; job 3, which ends before
    BACK, starts."""
    nodes = [node(1, gpus=4), node(2, state="draining", maintenance_ends=BACK)]
    h100 = {"gpu_types": ("H100",)}
    pending = [job(1, gpus=8, wall=3600, submitted=1.0, **h100),
               job(2, gpus=4, wall=20 * 3600, submitted=2.0, **h100),
               job(3, gpus=4, wall=3600, submitted=3.0, **h100)]
    quotas = Quotas(org={(1, "H100"): 8}, project={})
    res = schedule(snap(nodes, pending, now=NOW, policy="fifo_backfill", quotas=quotas))
    assert [(r.job_id, r.start_at, r.returning) for r in res.reservations] == [(1, BACK, True)]
    assert [p.job_id for p in res.placements] == [3]
    assert res.wait_reasons[2] == R.reserved_for(1)
