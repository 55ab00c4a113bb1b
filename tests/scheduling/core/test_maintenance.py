"""Maintenance windows (Slurm's maintenance reservations): a node whose window is ahead takes only
jobs that end (by their max wall) before it starts; no reservation or preemption counts on it."""

from __future__ import annotations

from scheduling.core import Quotas, schedule
from scheduling.core import reasons as R
from scheduling.core.reasons import utc_time
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


def test_no_reservation_is_made_that_would_run_into_a_window() -> None:
    """Review: a node beyond every pending wall from now stays in the pass, but a reservation
    starts later: an 8 h job reserved from +5 h on a node whose window is at +10 h could never
    start there, and it kept a job that ends in time off the free GPUs."""
    nodes = [node(1, free=range(4, 8), available_until=NOW + 10 * 3600)]
    run = [running(50, ((1, (0, 1, 2, 3)),), cls="production", preemptible=False, started=NOW,
                   wall=5 * 3600)]
    pending = [job(1, gpus=8, wall=8 * 3600, submitted=1.0), job(2, gpus=4, wall=6 * 3600, submitted=2.0)]
    res = schedule(snap(nodes, pending, run, now=NOW))
    assert res.reservations == []
    assert [(p.job_id, p.allocations) for p in res.placements] == [(2, ((1, (4, 5, 6, 7)),))]


def test_no_job_is_preempted_for_one_that_would_run_into_a_window() -> None:
    window = NOW + 4 * 3600 + 60  # the production job's 4 h would end after it, once the victim has gone
    nodes = [node(1, free=(), available_until=window)]
    run = [running(50, ((1, tuple(range(8))),), cls="batch", started=NOW - 7200, wall=86_400)]
    res = schedule(snap(nodes, [job(1, gpus=8, cls="production", wall=4 * 3600)], run, now=NOW,
                        grace_seconds=120))
    assert res.preemptions == []
    later = schedule(snap([node(1, free=(), available_until=window + 3600)],
                          [job(1, gpus=8, cls="production", wall=4 * 3600)], run, now=NOW, grace_seconds=120))
    assert [p.job_id for p in later.preemptions] == [50]  # with room before the window it may


def test_a_long_job_of_another_type_does_not_hold_a_node_out() -> None:
    """Review: the horizon was the longest pending wall of any type, so a 7-day A100 job kept an
    H100 node with a window in 3 days out of the pass, and a 16-GPU H100 gang could not run."""
    nodes = [node(1, ib_group="ib", available_until=NOW + 3 * 86_400), node(2, ib_group="ib")]
    gang = job(1, gpus=16, wall=3600, gpu_types=("H100",), submitted=1.0)
    a100 = job(2, gpus=1, wall=7 * 86_400, gpu_types=("A100",), submitted=2.0)
    res = schedule(snap(nodes, [gang, a100], now=NOW))
    assert [p.job_id for p in res.placements] == [1]


def test_a_job_placed_before_a_window_is_not_held_back_by_its_own_quota_claim() -> None:
    """Review: the job's EASY reservation claimed its quota room; the fill counted that claim
    against the job itself, beside the job, and refused it."""
    nodes = [node(1, free=(7,)), node(2, available_until=WINDOW)]
    run = [
        running(50, ((1, (0,)),), cls="production", preemptible=False, org_id=1, project_id=10, started=NOW,
                wall=86_400),
        running(51, ((1, (1, 2, 3, 4, 5, 6)),), cls="production", preemptible=False, org_id=2,
                project_id=20, started=NOW, wall=3600),
    ]
    pending = [job(1, gpus=4, wall=5400, org_id=1, gpu_types=("H100",), submitted=1.0),  # reserved from +1 h
               job(3, gpus=8, wall=3 * 3600, org_id=3, project_id=30, gpu_types=("H100",), submitted=3.0)]
    res = schedule(snap(nodes, pending, run, quotas=Quotas(org={(1, "H100"): 8}), now=NOW))
    assert [(p.job_id, p.allocations[0][0]) for p in res.placements] == [(1, 2)]


def test_jobs_told_to_wait_for_a_job_placed_before_a_window_wait_for_resources() -> None:
    """Fuzz: job 1 held GPUs 2,3 of node 2 (EASY); placed instead on node 1 before its window, its
    reservation went, but job 2 still waited `reserved-for-job-1`, naming a job holding nothing."""
    nodes = [node(1, gpus=4, available_until=NOW + 1800), node(2, gpus=4, free=(2, 3))]
    run = [running(900, ((2, (0, 1)),), started=NOW - 100, wall=5100.0)]
    pending = [job(1, gpus=3, wall=600.0, submitted=1.0), job(2, gpus=2, wall=7200.0, submitted=2.0)]
    res = schedule(snap(nodes, pending, run, now=NOW))
    assert [(p.job_id, p.allocations[0][0]) for p in res.placements] == [(1, 1)]
    assert res.reservations == [] or all(r.job_id != 1 for r in res.reservations)
    assert res.wait_reasons == {2: R.RESOURCES}
    [skip] = [d for d in res.decisions if d.job_id == 2]
    assert "job 1" in skip.detail and "next pass" in skip.detail


def test_a_job_longer_than_the_time_before_a_window_is_told_about_the_window() -> None:
    """QA: the only A100 node, ready, its window in 4 minutes; a 20-minute job was told it does
    not fit the ready fleet even when idle, with no word of the window."""
    nodes = [node(1, "A100", 4, available_until=NOW + 240, maintenance_ends=NOW + 3600)]
    pending = [job(90, wall=1200.0, gpu_types=("A100",), submitted=1.0),
               job(92, wall=120.0, gpu_types=("A100",), submitted=2.0)]
    # Without a reservation (none may be made here), the note names the window and its end.
    res = schedule(snap(nodes, pending, now=NOW, max_reservations=0))
    assert [p.job_id for p in res.placements] == [92]  # ends before the window: filled in
    [skip] = res.skips
    assert skip.job_id == 90 and "1 due-for-maintenance node of its types" in skip.detail
    assert skip.detail.endswith(f"; the first maintenance ends {utc_time(NOW + 3600)})")  # QA: and when
    # With one, it is reserved from the window's end. (Before review 19, job 92, first in the queue,
    # took the A100 reservation from the window's end and then gave it up when filled in before the
    # window, so job 90 had none; a reservation on GPUs back from maintenance only takes no slot.)
    res = schedule(snap(nodes, pending, now=NOW))
    assert [p.job_id for p in res.placements] == [92]
    [skip] = res.skips
    assert skip.detail == (
        f"reserved: earliest start {utc_time(NOW + 3600)} on A100, on GPUs back from maintenance by then"
    )
    assert [(r.job_id, r.start_at) for r in res.reservations] == [(90, NOW + 3600)]


def test_a_job_behind_quota_room_promised_to_a_job_placed_before_a_window_waits_for_its_quota() -> None:
    """Review: the org's H100 quota is 5; job 1 (4 GPUs) was promised the room, then placed before
    node 1's window. Job 2 (2 GPUs) is over the quota now, not waiting for GPUs."""
    nodes = [node(1, gpus=4, available_until=NOW + 1800), node(2, gpus=8, free=(6, 7))]
    run = [running(900, ((2, (0, 1, 2, 3, 4, 5)),), started=NOW - 100, wall=1000.0, org_id=9)]
    pending = [job(1, gpus=4, wall=600.0, submitted=1.0, gpu_types=("H100",)),
               job(2, gpus=2, wall=7200.0, submitted=2.0, gpu_types=("H100",))]
    res = schedule(snap(nodes, pending, run, now=NOW, quotas=Quotas(org={(1, "H100"): 5})))
    assert [p.job_id for p in res.placements] == [1]
    assert res.wait_reasons[2] == R.QUOTA
    [skip] = [d for d in res.skips if d.job_id == 2]
    assert "H100 org 4 of 5 in use" in skip.detail


# -- the expected start of a job that only a node in (or too near) its maintenance window can hold --

BACK = NOW + 3600  # when the window of the node in maintenance ends


def test_a_job_only_a_node_in_its_window_can_hold_is_reserved_from_the_windows_end() -> None:
    """The only H100 node is inside its window (the scheduler sees it draining) until BACK: the
    8-GPU job is reserved from BACK on it (its expected start), and nothing is placed there meanwhile."""
    nodes = [node(1, state="draining", maintenance_ends=BACK)]
    pending = [job(1, gpus=8, wall=7200, submitted=1.0), job(2, gpus=1, wall=60, submitted=2.0)]
    res = schedule(snap(nodes, pending, now=NOW, policy="fifo_backfill"))
    assert res.placements == []
    assert [(r.job_id, r.start_at, r.allocations, r.kind) for r in res.reservations] == [
        (1, BACK, ((1, tuple(range(8))),), "backfill")
    ]
    assert res.wait_reasons == {1: R.RESOURCES, 2: R.RESOURCES}
    assert res.skips[0].detail == (
        f"reserved: earliest start {utc_time(BACK)} on H100, on GPUs back from maintenance by then"
    )


def test_a_job_still_running_on_the_node_past_the_windows_end_is_waited_for() -> None:
    """Running jobs are left to the operator during a window: GPUs a job holds past the window's end
    free only at its wall."""
    nodes = [node(1, state="draining", maintenance_ends=BACK)]
    run = [running(50, ((1, (0, 1, 2, 3)),), cls="production", preemptible=False, started=NOW - 100,
                   wall=5000)]  # ends at NOW + 4,900, after BACK
    res = schedule(snap(nodes, [job(1, gpus=8, wall=7200)], run, now=NOW))
    assert [(r.start_at, r.allocations) for r in res.reservations] == [(NOW + 4900, ((1, tuple(range(8))),))]
    res = schedule(snap(nodes, [job(1, gpus=4, wall=7200)], run, now=NOW))
    assert [(r.start_at, r.allocations) for r in res.reservations] == [(BACK, ((1, (4, 5, 6, 7)),))]


def test_a_ready_node_held_out_for_its_window_is_reserved_from_its_end_and_filled_before_it() -> None:
    """Node 1's window runs from NOW + 600 to BACK: it is held out of the pass. The 8-GPU job is
    reserved from BACK there; the fill still gives the node a job that ends before the window, and
    none that would run into it."""
    nodes = [node(1, available_until=NOW + 600, maintenance_ends=BACK)]
    pending = [job(1, gpus=8, wall=7200, submitted=1.0), job(2, gpus=4, wall=300, submitted=2.0),
               job(3, gpus=4, wall=1200, submitted=3.0)]
    res = schedule(snap(nodes, pending, now=NOW, policy="fifo_backfill"))
    assert [(p.job_id, p.reason_code) for p in res.placements] == [(2, R.BACKFILLED)]
    assert [(r.job_id, r.start_at) for r in res.reservations] == [(1, BACK)]
    assert res.wait_reasons == {1: R.RESOURCES, 3: R.RESOURCES}


def test_the_sooner_of_the_ready_fleet_and_the_node_back_from_maintenance_is_reserved() -> None:
    later = NOW + 10_000
    for busy_until, start, on in ((later, BACK, 1), (NOW + 1000, NOW + 1000, 2)):
        nodes = [node(1, state="draining", maintenance_ends=BACK), node(2, free=())]
        run = [running(50, ((2, tuple(range(8))),), cls="production", preemptible=False, started=NOW,
                       wall=busy_until - NOW)]
        res = schedule(snap(nodes, [job(1, gpus=8, wall=7200)], run, now=NOW))
        assert [(r.start_at, r.allocations[0][0]) for r in res.reservations] == [(start, on)]


def test_no_backfill_delays_a_gang_that_needs_a_node_back_from_maintenance() -> None:
    """One IB group: node 1 ready and idle, node 2 in its window until BACK. The 16-GPU gang is
    reserved from BACK on both, node 1's GPUs held for it: a job that ends by then may use them, one
    that would run past it may not (before, no reservation was made and it took node 1)."""
    nodes = [node(1, ib_group="g"), node(2, ib_group="g", state="draining", maintenance_ends=BACK)]
    gang = job(1, gpus=16, wall=7200, submitted=1.0)
    for wall, placed in ((3600, [2]), (3601, [])):
        res = schedule(snap(nodes, [gang, job(2, gpus=8, wall=wall, submitted=2.0)], now=NOW,
                            policy="fifo_backfill"))
        assert [(r.job_id, r.start_at, {n for n, _ in r.allocations}) for r in res.reservations] == [
            (1, BACK, {1, 2})
        ]
        assert [p.job_id for p in res.placements] == placed
        if not placed:
            assert res.wait_reasons[2] == R.reserved_for(1)


def test_a_type_whose_nodes_are_all_in_maintenance_is_reserved_after_the_pass_settles() -> None:
    """The H100 fleet is full and reserved (the pass settles: nothing more can start on a ready
    node); the A100 job, whose only node is in its window, still gets its reservation."""
    nodes = [node(1, free=()), node(2, "A100", state="draining", maintenance_ends=BACK)]
    run = [running(50, ((1, tuple(range(8))),), cls="production", preemptible=False, started=NOW,
                   wall=86_400)]
    pending = [job(1, gpus=8, wall=3600, gpu_types=("H100",), submitted=1.0),
               job(2, gpus=8, wall=3600, gpu_types=("H100",), submitted=2.0),
               job(3, gpus=4, wall=3600, gpu_types=("A100",), submitted=3.0)]
    res = schedule(snap(nodes, pending, run, now=NOW, preemption=False))
    assert sorted((r.job_id, r.gpu_type, r.start_at) for r in res.reservations) == [
        (1, "H100", NOW + 86_400), (3, "A100", BACK)
    ]


def test_a_node_drained_or_down_is_no_promise_even_with_a_window() -> None:
    """Without `maintenance_ends` (the adapter leaves it out when a cordon or the node's health
    keeps it out anyway) a node that is not ready counts for nothing, as before."""
    nodes = [node(1, state="draining")]
    res = schedule(snap(nodes, [job(1, gpus=8, wall=7200)], now=NOW))
    assert res.reservations == [] and res.wait_reasons == {1: R.RESOURCES}


def test_a_node_kept_in_the_pass_is_not_counted_again_as_back_from_its_window() -> None:
    """A node whose window is beyond every pending run from now stays in the pass (its GPUs count
    as they free, until its window). A reservation whose run would cross that window is still not
    made, nor one from the window's end: not estimated (only nodes out of the pass are counted
    from their window's end)."""
    nodes = [node(1, free=range(4, 8), available_until=NOW + 10 * 3600, maintenance_ends=NOW + 11 * 3600)]
    run = [running(50, ((1, (0, 1, 2, 3)),), cls="production", preemptible=False, started=NOW,
                   wall=5 * 3600)]
    res = schedule(snap(nodes, [job(1, gpus=8, wall=8 * 3600)], run, now=NOW))
    assert res.reservations == [] and res.wait_reasons == {1: R.RESOURCES}
