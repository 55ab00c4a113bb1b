"""EASY backfill: a reservation for the top blocked job that later jobs never delay."""

from __future__ import annotations

from scheduling.core import Skip, schedule
from scheduling.core import reasons as R
from tests.scheduling.core.helpers import job, node, running, snap

NOW = 10_000.0


def _blocked_fleet() -> tuple[list, list]:
    # Node 1: 4 GPUs busy until NOW+3600 (wall), 4 free. Top job needs 8.
    nodes = [node(1)]
    run = [running(50, ((1, (0, 1, 2, 3)),), started=NOW - 100, wall=3700)]
    return nodes, run


def test_reservation_at_earliest_start() -> None:
    nodes, run = _blocked_fleet()
    res = schedule(snap(nodes, [job(1, gpus=8, cls="production")], run, now=NOW))
    r = res.reservation
    assert r is not None and r.job_id == 1 and r.start_at == NOW + 3600
    assert res.wait_reasons[1] == R.RESOURCES
    # Times in the detail are ISO 8601 UTC (13,600 s after the epoch), not raw epoch seconds.
    (detail,) = [d.detail for d in res.decisions if isinstance(d, Skip) and d.job_id == 1]
    assert detail.startswith("reserved: earliest start 1970-01-01T03:46:40Z on H100")


def test_short_job_backfills_long_job_waits() -> None:
    nodes, run = _blocked_fleet()
    pending = [
        job(1, gpus=8, cls="production"),
        job(2, gpus=2, cls="batch", wall=1800),  # ends before the reservation: backfill
        job(3, gpus=2, cls="batch", wall=7200),  # would still hold GPUs at NOW+3600: must wait
    ]
    res = schedule(snap(nodes, pending, run, now=NOW))
    assert [(p.job_id, p.backfilled) for p in res.placements] == [(2, True)]
    assert res.wait_reasons[3] == R.reserved_for(1)


def test_long_job_may_use_gpus_the_reservation_does_not_need() -> None:
    nodes, run = _blocked_fleet()
    nodes.append(node(2, free=[0, 1]))
    pending = [job(1, gpus=8, cls="production"), job(2, gpus=2, cls="batch", wall=99_999)]
    res = schedule(snap(nodes, pending, run, now=NOW))
    assert [(p.job_id, p.allocations[0][0]) for p in res.placements] == [(2, 2)]


def test_backfill_never_delays_the_reserved_job() -> None:
    # Simulate: after the pass, advance to the reservation time honouring max walls; the reserved
    # job must fit on what is then free, whatever was backfilled.
    nodes, run = _blocked_fleet()
    nodes += [node(2, free=[0, 1, 2, 3, 4, 5]), node(3, free=[0])]
    pending = [job(1, gpus=8, cls="production")] + [
        job(10 + k, gpus=1 + k % 3, cls="batch", wall=600.0 * (1 + k)) for k in range(12)
    ]
    res = schedule(snap(nodes, pending, run, now=NOW))
    r = res.reservation
    assert r is not None
    busy_at_start: set[tuple[int, int]] = set()
    for rj in run:
        if rj.started_at + rj.max_wall_seconds > r.start_at:
            busy_at_start |= {(n, i) for n, idx in rj.allocations for i in idx}
    for p in res.placements:
        if NOW + p.max_wall_seconds > r.start_at:
            busy_at_start |= {(n, i) for n, idx in p.allocations for i in idx}
    reserved = {(n, i) for n, idx in r.allocations for i in idx}
    assert len(reserved) == 8 and not (reserved & busy_at_start)
    assert any(p.backfilled for p in res.placements)


def test_no_backfill_in_fifo_policy_and_backfill_in_fifo_backfill() -> None:
    nodes, run = _blocked_fleet()
    pending = [job(1, gpus=8, submitted=0), job(2, gpus=2, submitted=1, wall=1800)]
    assert schedule(snap(nodes, pending, run, now=NOW, policy="fifo")).placements == []
    (p,) = schedule(snap(nodes, pending, run, now=NOW, policy="fifo_backfill")).placements
    assert p.job_id == 2 and p.backfilled


def test_job_bigger_than_ready_fleet_gets_no_reservation() -> None:
    res = schedule(snap([node(1)], [job(1, gpus=64), job(2, gpus=1, cls="batch")]))
    assert res.reservation is None and res.wait_reasons[1] == R.RESOURCES
    assert [p.job_id for p in res.placements] == [2]


def test_a_job_behind_another_reservation_of_its_type_is_not_told_it_never_fits() -> None:
    """QA: while a preemption's victims used their grace, every other blocked job of the type read
    "does not fit the ready fleet even when idle" (its type had a reservation already)."""
    run = [running(50, ((1, tuple(range(8))),), cls="batch", started=0.0, wall=86_400)]
    pending = [job(1, gpus=8, cls="production", submitted=1.0), job(2, gpus=8, cls="batch", submitted=2.0)]
    res = schedule(snap([node(1, free=())], pending, run, now=10_000.0))
    assert res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION
    assert (res.wait_reasons[2], res.skips[-1].detail) == (R.RESOURCES, "no free gang of GPUs")


def test_a_blocked_job_of_each_type_keeps_its_reservation() -> None:
    """QA: with one reservation per pass, a blocked T4 job had none whenever an H100 job held it,
    and a later, lower-priority T4 job took the GPUs it was about to get (an hour's delay)."""
    nodes = [node(1, free=()), node(2, "T4", free=range(4, 8))]
    run = [running(50, ((1, tuple(range(8))),), cls="production", preemptible=False, started=0.0, wall=7200),
           running(51, ((2, (0, 1, 2, 3)),), cls="production", preemptible=False, gpu_type="T4", started=0.0,
                   wall=1200)]
    pending = [
        job(1, gpus=8, gpu_types=("H100",), cls="premium", submitted=1.0),
        job(2, gpus=8, gpu_types=("T4",), cls="interactive", submitted=2.0, wall=600),
        job(3, gpus=4, gpu_types=("T4",), cls="interactive", submitted=3.0, wall=3600),  # would take them
    ]
    res = schedule(snap(nodes, pending, run, now=1000.0, preemption=False))
    assert sorted((r.job_id, r.gpu_type) for r in res.reservations) == [(1, "H100"), (2, "T4")]
    assert res.placements == [] and res.wait_reasons[3] == R.reserved_for(2)
    once = schedule(snap(nodes, pending, run, now=1000.0, preemption=False, max_reservations=1))
    assert [p.job_id for p in once.placements] == [3]  # EASY's one reservation: job 2 unprotected


def test_a_gang_larger_than_the_ready_fleet_is_told_so_beside_other_reservations() -> None:
    """Review: with another job's reservation on its type, a 64-GPU job on an 8-GPU fleet read
    "no free gang of GPUs" instead of that it does not fit the ready fleet."""
    run = [running(50, ((1, tuple(range(8))),), cls="production", preemptible=False, started=0.0, wall=7200)]
    pending = [job(1, gpus=8, submitted=1.0), job(2, gpus=64, submitted=2.0)]
    res = schedule(snap([node(1, free=())], pending, run, now=1000.0, preemption=False))
    assert [r.job_id for r in res.reservations] == [1]
    assert res.skips[-1].detail == "does not fit the ready fleet even when idle"
