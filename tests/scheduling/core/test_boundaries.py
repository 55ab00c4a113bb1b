"""The scheduler's comparisons at their exact boundaries (mutation testing, session 18)."""

from __future__ import annotations

from scheduling.core import reasons as R
from scheduling.core import schedule
from tests.scheduling.core.helpers import job, node, running, snap

NOW = 10_000.0


def _reserved_at_now_plus_1000() -> tuple[list, list]:
    # 4 of 8 GPUs busy until NOW+1000 (by max wall): a job needing all 8 is reserved from then.
    nodes = [node(1)]
    run = [running(50, ((1, (0, 1, 2, 3)),), started=NOW - 100, wall=1100)]
    return nodes, run


def test_a_backfill_ending_exactly_at_the_reservation_starts_one_second_longer_waits() -> None:
    """Mutation testing, session 18: the backfill condition `end <= start_at` loosened by a minute
    went unnoticed: a backfilled job could then still hold the GPUs when the reserved job was due,
    delaying it (EASY backfill's one promise)."""
    nodes, run = _reserved_at_now_plus_1000()
    fits = [job(1, gpus=8, cls="production"), job(2, gpus=2, cls="batch", wall=1000)]
    res = schedule(snap(nodes, fits, run, now=NOW))
    assert res.reservation is not None and res.reservation.start_at == NOW + 1000
    assert [(p.job_id, p.backfilled) for p in res.placements] == [(2, True)]

    late = [job(1, gpus=8, cls="production"), job(3, gpus=2, cls="batch", wall=1001)]
    res = schedule(snap(nodes, late, run, now=NOW))
    assert res.reservation is not None and res.reservation.start_at == NOW + 1000
    assert res.placements == []
    assert res.wait_reasons[3] == R.reserved_for(1)


def test_a_job_asking_exactly_a_types_memory_runs_on_it() -> None:
    """Mutation testing, session 18: the memory floor `memory_gb >= gpu_memory_gb` made `>` went
    unnoticed: a job asking for 80 GB would never run on an 80 GB H100 (no matching type)."""
    res = schedule(snap([node(1, "H100")], [job(1, gpu_memory_gb=80)]))
    assert [(p.job_id, p.gpu_type) for p in res.placements] == [(1, "H100")]
