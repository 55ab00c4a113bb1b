"""The core's default priority-class table is the issue's ladder and equals the DB default."""

from __future__ import annotations

import importlib

from scheduling.core import DEFAULT_PRIORITY_CLASSES, schedule
from tests.scheduling.core.helpers import job, node, running, snap

LADDER = ("production", "premium", "standard", "batch", "interactive")


def test_default_ladder_only_production_is_never_preemptible() -> None:
    by_rank = sorted(DEFAULT_PRIORITY_CLASSES, key=lambda c: -c.rank)
    assert tuple(c.name for c in by_rank) == LADDER
    assert [c.name for c in by_rank if not c.preemptible_by_higher] == ["production"]


def test_core_defaults_match_the_db_default_migration() -> None:
    mig = importlib.import_module("scheduling.migrations.0002_default_priority_classes")
    db = sorted(mig.DEFAULTS, key=lambda row: -row[1])
    core = sorted(DEFAULT_PRIORITY_CLASSES, key=lambda c: -c.rank)
    assert [(n, p, c) for n, _, p, c in db] == [
        (c.name, c.preemptible_by_higher, c.can_preempt) for c in core
    ]


def test_production_preempts_premium() -> None:
    run = [running(50, ((1, tuple(range(8))),), cls="premium", started=0, wall=99_999)]
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], run, now=10_000.0))
    assert [p.job_id for p in res.preemptions] == [50]


def test_a_job_that_fits_only_on_nodes_not_ready_says_so() -> None:
    # Two 8-GPU H100 nodes, one drained and one down: the 8-GPU job fits neither ready node.
    nodes = [node(1, gpus=4), node(2, state="draining"), node(3, state="down"), node(4, "A100", state="down")]
    res = schedule(snap(nodes, [job(1, gpus=8, gpu_types=("H100",))]))
    (skip,) = res.skips
    assert skip.detail == (
        "does not fit the ready fleet even when idle (not ready now: 1 down, 1 draining nodes of its types)"
    )


def test_a_job_waiting_for_a_maintenance_window_to_end_is_told_when_it_ends() -> None:
    """QA: a job that fits only nodes in their maintenance window was told they were "draining",
    with no word of when the window ends."""
    nodes = [node(1, gpus=4), node(2, state="draining", maintenance_ends=7200.5),
             node(3, state="draining", maintenance_ends=9000.0), node(4, state="down"),
             node(5, "A100", state="draining", maintenance_ends=3600.0)]  # not a type it takes
    # Without a reservation (none may be made here), the note says when the first window ends.
    res = schedule(snap(nodes, [job(1, gpus=8, gpu_types=("H100",))], now=3_000.0, max_reservations=0))
    (skip,) = res.skips
    assert skip.detail == (
        "no free gang of GPUs; does not fit the ready fleet even when idle (not ready now: 1 down, "
        "2 in-maintenance nodes of its types; the first maintenance ends 1970-01-01T02:00:01Z)"
    )
    # With one, it is reserved from that end on the node then back (test_maintenance.py).
    res = schedule(snap(nodes, [job(1, gpus=8, gpu_types=("H100",))], now=3_000.0))
    (skip,) = res.skips
    assert skip.detail == (
        "reserved: earliest start 1970-01-01T02:00:01Z on H100, on GPUs back from maintenance by then"
    )
    assert [(r.start_at, r.allocations) for r in res.reservations] == [(7200.5, ((2, tuple(range(8))),))]


def test_a_job_blocked_behind_a_reservation_still_names_the_nodes_not_ready() -> None:
    """QA: with another job holding the pass's reservation, the H100 job said only "no free gang"."""
    nodes = [node(1, "T4", gpus=4), node(2, state="draining"), node(3, state="down"), node(4, gpus=2)]
    run = [running(50, ((1, (0, 1, 2, 3)),), cls="batch", gpu_type="T4"), running(51, ((4, (0, 1)),))]
    pending = [
        job(1, gpus=4, gpu_types=("T4",), cls="premium"),  # blocked first: takes the reservation
        job(2, gpus=8, gpu_types=("H100",)),  # 8 H100 only fit the two nodes that are not ready
        job(3, gpus=2, gpu_types=("H100",)),  # fits the ready 2-GPU node once idle: no note
    ]
    res = schedule(snap(nodes, pending, run, preemption=False, max_reservations=1))  # taken by job 1
    details = {s.job_id: s.detail for s in res.skips}
    assert details[2] == (
        "no free gang of GPUs; does not fit the ready fleet even when idle "
        "(not ready now: 1 down, 1 draining nodes of its types)"
    )
    assert details[3] == "no free gang of GPUs"
