"""Running jobs already signalled (`preemption_requested_at` set: a preemption, a cancellation or a
stop under way) leave at the latest at signal + grace. Each rule about them is pinned here; a
mutation-testing round found none of them failed a test when changed. Every test names the
mutation(s) it kills; each was applied by hand and seen to fail the test."""

from __future__ import annotations

import pytest

from scheduling.core import Quotas, Reservation, schedule
from scheduling.core import reasons as R
from tests.scheduling.core.helpers import job, node, running, snap

NOW = 10_000.0
GRACE = 120.0  # Config's default
SIGNALLED = NOW - 10  # every signalled job here was signalled 10 s ago: it leaves at NOW + 110
LONG = 99_999.0


def _signalled(jid: int = 50, alloc: tuple = ((1, tuple(range(8))),), **kw: object):
    kw.setdefault("cls", "batch")
    kw.setdefault("started", 0.0)
    kw.setdefault("wall", LONG)
    return running(jid, alloc, preemption_requested_at=SIGNALLED, **kw)


@pytest.mark.parametrize(
    ("wall_end", "start"),
    [(None, SIGNALLED + GRACE), (NOW + 50, NOW + 50)],
    ids=["grace-ends-first", "wall-ends-first"],
)
def test_a_signalled_victim_is_counted_on_from_signal_plus_grace_and_not_signalled_again(
    wall_end: float | None, start: float
) -> None:
    """A production job blocked by a batch job signalled before counts on it: no Preempt decision,
    `waiting-for-preemption`, and a preemption reservation from min(signal + grace, wall end).

    Kills: `_Pass._signal` signalling every plan victim (`new = list(plan.victims)`: a second
    Preempt); `_Pass._exit_by` without `+ grace` (start = now), treating the victim as unsignalled
    (signalled = now: start = now + grace), or without the wall-end term of its min."""
    wall = LONG if wall_end is None else wall_end  # started at 0
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], [_signalled(wall=wall)], now=NOW))
    assert res.preemptions == []
    assert res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION
    assert res.skips[0].detail == "on H100: waiting for job 50 to exit"
    assert res.reservations == [Reservation(1, "H100", start, ((1, tuple(range(8))),), "preemption")]


def test_counting_on_a_signalled_victim_uses_none_of_the_passs_new_preemption_budget() -> None:
    """`max_preemptions_per_pass` caps *newly* signalled victims: with a cap of 0, a plan made of a
    victim signalled before still goes ahead.

    Kills: `_Pass._signal` counting every plan victim against the budget (`len(plan.victims)`)."""
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], [_signalled()], now=NOW,
                        max_preemptions_per_pass=0))
    assert res.preemptions == [] and res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION


_TOO_AGED = -30 * 86_400.0  # waited 30 days before it started: it would re-queue above production


@pytest.mark.parametrize(
    "kw",
    [
        {"started": NOW - 100},  # inside the 600-s minimum runtime
        {"started": NOW - 5_000, "times_preempted": 10},  # inside its grown exemption (600 x 2**5)
        {"preemptible": False},  # a non-preemptible job stopping anyway (a cancellation, say)
        {"wall": NOW + 60},  # 60 s left: the gain rule would refuse it (it needs 3,600 s left)
        {"started": NOW - 1_000, "submitted_at": NOW - 1_000 + _TOO_AGED},  # would re-queue above
    ],
    ids=["min-runtime", "grown-exemption", "not-preemptible", "gain-rule", "requeue-priority"],
)
def test_a_signalled_job_is_a_candidate_whatever_would_protect_a_job_not_yet_signalled(kw: dict) -> None:
    """It is leaving anyway (docstrings of `VictimIndex.usable`: "signalled, or past its
    exemption"; `Config.preemption_min_gain` and `VictimIndex.plan`: "a victim not yet signalled"),
    so neither its exemption, its own flag, the gain rule nor the re-queue rule keeps a preemptor
    from counting on it. Each of these protects the same job unsignalled (checked below).

    Kills: `VictimIndex.__init__` admitting only `eligible` jobs (`if not eligible: continue`: the
    first three cases), and `VictimIndex._usable` without its `if signalled: return True` (the last
    two)."""
    pending = [job(1, gpus=8, cls="production", submitted=NOW)]
    res = schedule(snap([node(1)], pending, [_signalled(**kw)], now=NOW))
    assert res.preemptions == [] and res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION
    # The same job not signalled is protected: nothing is stopped for job 1.
    unsignalled = running(50, ((1, tuple(range(8))),), **{"cls": "batch", "started": 0.0, "wall": LONG, **kw})
    res = schedule(snap([node(1)], pending, [unsignalled], now=NOW))
    assert res.preemptions == [] and res.wait_reasons[1] == R.RESOURCES


def test_a_signalled_job_is_never_named_as_stopping_being_exempt() -> None:
    """Job 1 counts on the signalled job 50 (inside its minimum runtime); job 2, a second production
    job, finds no victim. Its detail must not name job 50's exemption end as when preemption could
    help: job 50 is no candidate to wait for, it is leaving (and promised to job 1).

    Kills: `VictimIndex.__init__` recording exemption ends of signalled jobs too (dropping
    `not signalled` from its condition)."""
    pending = [job(1, gpus=8, cls="production", submitted=0), job(2, gpus=8, cls="production", submitted=1)]
    res = schedule(snap([node(1)], pending, [_signalled(started=NOW - 100)], now=NOW))
    assert res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION
    assert res.wait_reasons[2] == R.RESOURCES
    assert "exempt" not in res.skips[1].detail, res.skips[1].detail


def test_on_one_node_a_signalled_victim_is_taken_before_a_lower_class_one() -> None:
    """Node 1: batch job 50 (signalled) on GPUs 0-3, interactive job 51 (lower class, not signalled)
    on 4-7. A 4-GPU production job counts on job 50 and signals nobody.

    Kills: `VictimIndex._key` without its signalled term (job 51, the lowest class, would be
    taken first and signalled)."""
    run = [
        _signalled(50, ((1, (0, 1, 2, 3)),)),
        running(51, ((1, (4, 5, 6, 7)),), cls="interactive", started=0, wall=LONG),
    ]
    res = schedule(snap([node(1)], [job(1, gpus=4, cls="production")], run, now=NOW))
    assert res.preemptions == []
    assert res.reservations == [Reservation(1, "H100", SIGNALLED + GRACE, ((1, (0, 1, 2, 3)),), "preemption")]


def test_a_plan_of_signalled_victims_beats_one_that_signals_a_lower_class_job() -> None:
    """Node 1: batch job 50 (signalled) on all 8 GPUs; node 2: interactive job 51 (not signalled)
    on all 8. An 8-GPU production job takes node 1's plan (no new victim) over node 2's (one new
    victim of a lower class), whichever node is searched first.

    Kills: `VictimIndex._cost` counting every victim as new (`new = list(victims)`: node 2's
    plan, of a lower highest class, would win)."""
    for run in (
        [_signalled(50), running(51, ((2, tuple(range(8))),), cls="interactive", started=0, wall=LONG)],
        [running(51, ((2, tuple(range(8))),), cls="interactive", started=0, wall=LONG), _signalled(50)],
    ):
        res = schedule(snap([node(1), node(2)], [job(1, gpus=8, cls="production")], run, now=NOW))
        assert res.preemptions == []
        assert [(r.start_at, r.allocations) for r in res.reservations] == [
            (SIGNALLED + GRACE, ((1, tuple(range(8))),))
        ]


def test_a_multi_node_plan_takes_the_signalled_victim_first() -> None:
    """One IB group of three 8-GPU nodes: batch job 50 (signalled) on node 1, interactive jobs 51
    and 52 on nodes 2 and 3. A 16-GPU production gang needs two nodes: job 50's and one more, so
    exactly one new victim.

    Kills: `VictimIndex._key` without its signalled term (`_choose` would take both interactive
    jobs, two new victims)."""
    nodes = [node(n, ib_group="g") for n in (1, 2, 3)]
    run = [
        _signalled(50),
        running(51, ((2, tuple(range(8))),), cls="interactive", started=0, wall=LONG),
        running(52, ((3, tuple(range(8))),), cls="interactive", started=0, wall=LONG),
    ]
    res = schedule(snap(nodes, [job(1, gpus=16, cls="production")], run, now=NOW))
    assert len(res.preemptions) == 1 and res.preemptions[0].job_id in (51, 52)
    (reservation,) = res.reservations
    assert 1 in {n for n, _ in reservation.allocations}
    assert reservation.start_at == NOW + GRACE  # the new victim's grace, the later of the two exits


@pytest.mark.parametrize(
    ("wall_end", "start"),
    [(None, SIGNALLED + GRACE), (NOW + 50, NOW + 50)],
    ids=["grace-ends-first", "wall-ends-first"],
)
def test_the_easy_reservation_counts_a_signalled_job_as_leaving_at_signal_plus_grace(
    wall_end: float | None, start: float
) -> None:
    """FIFO + EASY (no preemption): job 1 (8 GPUs) waits for the signalled job 50 on GPUs 0-3 of
    node 1; its reservation starts at min(signal + grace, wall end). A later 4-GPU job that ends by
    then backfills on the free GPUs 4-7; one that ends after it does not.

    Kills: `backfill.release_time` without its signalled branch (start at the wall end: the long
    job would backfill), without `+ grace` (start = now: the short one could not), or without the
    wall-end term of its min."""
    wall = LONG if wall_end is None else wall_end
    run = [_signalled(50, ((1, (0, 1, 2, 3)),), cls="standard", wall=wall)]
    head = job(1, gpus=8, submitted=0)
    short = job(2, gpus=4, submitted=1, wall=start - NOW)
    long_ = job(3, gpus=4, submitted=1, wall=start - NOW + 1)
    res = schedule(snap([node(1)], [head, short], run, now=NOW, policy="fifo_backfill"))
    assert res.reservation == Reservation(1, "H100", start, ((1, tuple(range(8))),), "backfill")
    assert [p.job_id for p in res.placements] == [2]
    res = schedule(snap([node(1)], [head, long_], run, now=NOW, policy="fifo_backfill"))
    assert res.reservation is not None and res.reservation.start_at == start
    assert res.placements == [] and res.wait_reasons[3] == R.reserved_for(1)


def test_end_time_packing_reads_a_signalled_jobs_end_as_signal_plus_grace() -> None:
    """end_time_packing="partial": node 1 runs job 50, signalled, leaving at NOW + 990 (grace 1,000);
    node 2 runs job 51 until NOW + 1,500. A 4-GPU job of wall 1,000 goes beside the job that ends
    closest to NOW + 1,000: job 50's node.

    Kills: `FleetState.__init__` (packing) treating signalled jobs as running to their wall (node
    1's end far off), or without `+ grace` (node 1's end now)."""
    run = [
        _signalled(50, ((1, (0, 1, 2, 3)),)),
        running(51, ((2, (0, 1, 2, 3)),), started=NOW - 100, wall=1_600),
    ]
    res = schedule(snap([node(1), node(2)], [job(1, gpus=4, cls="batch", wall=1_000)], run, now=NOW,
                        end_time_packing="partial", grace_seconds=1_000))
    assert [p.allocations[0][0] for p in res.placements] == [1]


def test_the_quota_counts_a_signalled_jobs_room_as_freeing_at_signal_plus_grace() -> None:
    """Org 1 (cap 8 H100) runs the signalled job 50 on all 8 GPUs of node 1; node 2 is idle. A batch
    job of org 1 (it may not preempt) waits for its quota with the room reserved from signal + grace.

    Kills: `QuotaBook.exit_at` treating signalled jobs as running to their wall, or without
    `+ grace` (room from now)."""
    run = [_signalled(50, org_id=1, project_id=10)]
    res = schedule(snap([node(1), node(2)], [job(1, gpus=4, cls="batch", gpu_types=("H100",))], run,
                        quotas=Quotas(org={(1, "H100"): 8}), now=NOW))
    assert res.wait_reasons[1] == R.QUOTA
    assert res.reservations == [Reservation(1, "H100", SIGNALLED + GRACE, (), "quota")]


def test_a_quota_preemption_counts_on_a_signalled_job_even_one_reaching_its_wall_first() -> None:
    """Org 1 (cap 8 H100): batch job 50, signalled, on GPUs 0-3 of node 1 reaches its wall at
    NOW + 50; batch job 51 on GPUs 4-7 runs on. A production job of org 1 (4 GPUs, node 2 idle) is
    over the quota now; its deficit counts job 50 as running on (a free victim it may take), and
    its plan takes job 50, not job 51: nobody is signalled.

    Kills: `VictimIndex.quota_plan` without the signalled term of its `gone_by` filter (job 50
    left out, job 51 signalled); `QuotaBook.__init__` not collecting signalled jobs
    (`self.signalled` empty) and `QuotaBook._peak` not counting them as running on (either way no
    deficit: the job would wait for its quota, not for job 50)."""
    run = [
        _signalled(50, ((1, (0, 1, 2, 3)),), org_id=1, project_id=10, wall=NOW + 50),
        running(51, ((1, (4, 5, 6, 7)),), cls="batch", org_id=1, project_id=10, started=0, wall=LONG),
    ]
    res = schedule(snap([node(1), node(2)], [job(1, gpus=4, cls="production", gpu_types=("H100",))], run,
                        quotas=Quotas(org={(1, "H100"): 8}), now=NOW))
    assert res.preemptions == []
    assert res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION
    assert res.skips[0].detail == "on H100: waiting for job 50 to exit (own quota)"


@pytest.mark.parametrize("stop_grace", [30.0, 600.0], ids=["cancel-shorter", "operator-longer"])
def test_a_stop_with_its_own_grace_is_counted_on_until_that_grace_ends(stop_grace: float) -> None:
    """A cancellation, a time-out or an out-of-credit stop gives the run its own grace (30 s by
    default), not a preemption's: the EASY reservation, the preemption claim, end-time packing
    and the quota count on its GPUs from signal + that grace (review: the preemption grace was
    assumed for every stop, so a longer stop grace set by an operator promised GPUs too early).

    Kills: `RunningJob.ends_by` ignoring `stop_grace_seconds`."""
    start = SIGNALLED + stop_grace
    run = [_signalled(50, ((1, (0, 1, 2, 3)),), cls="standard", stop_grace_seconds=stop_grace)]
    res = schedule(snap([node(1)], [job(1, gpus=8, submitted=0)], run, now=NOW, policy="fifo_backfill"))
    assert res.reservation == Reservation(1, "H100", start, ((1, tuple(range(8))),), "backfill")
    victim = _signalled(stop_grace_seconds=stop_grace)
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], [victim], now=NOW))
    assert res.reservations == [Reservation(1, "H100", start, ((1, tuple(range(8))),), "preemption")]
    res = schedule(snap([node(1), node(2)], [job(1, gpus=4, cls="batch", gpu_types=("H100",))],
                        [_signalled(50, org_id=1, project_id=10, stop_grace_seconds=stop_grace)],
                        quotas=Quotas(org={(1, "H100"): 8}), now=NOW))
    assert res.reservations == [Reservation(1, "H100", start, (), "quota")]
