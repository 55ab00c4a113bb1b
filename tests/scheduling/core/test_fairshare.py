"""Fair Tree ordering across org -> project -> user, aging, and stable tie-breaks."""

from __future__ import annotations

import pytest

from scheduling.core import Shares, Usage, fair_tree_factors, schedule
from tests.scheduling.core.helpers import job, node, running, snap


def _order(res) -> list[int]:  # type: ignore[no-untyped-def]
    return [d.job_id for d in res.decisions]


def test_orgs_ranked_by_usage_over_share() -> None:
    f = fair_tree_factors([(1, 10, 100), (2, 20, 200)], Usage(org={1: 100.0, 2: 10.0}), Shares())
    assert f[(2, 20, 200)] > f[(1, 10, 100)]
    # Org 1 has 20x the shares: now it is the under-served one.
    f = fair_tree_factors([(1, 10, 100), (2, 20, 200)], Usage(org={1: 100.0, 2: 10.0}), Shares(org={1: 20.0}))
    assert f[(1, 10, 100)] > f[(2, 20, 200)]


def test_tree_is_hierarchical_org_before_project_before_user() -> None:
    usage = Usage(
        org={1: 10.0, 2: 90.0},
        project={10: 9.0, 11: 1.0, 20: 90.0},
        user={(10, 100): 8.0, (10, 101): 1.0, (11, 110): 1.0, (20, 200): 90.0},
    )
    users = [(1, 10, 100), (1, 10, 101), (1, 11, 110), (2, 20, 200)]
    f = fair_tree_factors(users, usage, Shares())
    # Org 1 beats org 2 entirely; inside org 1 project 11 beats 10; inside 10 user 101 beats 100.
    assert f[(1, 11, 110)] > f[(1, 10, 101)] > f[(1, 10, 100)] > f[(2, 20, 200)]


def test_equal_paths_share_a_rank() -> None:
    f = fair_tree_factors([(1, 10, 100), (2, 20, 200)], Usage(), Shares())
    assert f[(1, 10, 100)] == f[(2, 20, 200)] == 1.0


def test_class_first_then_fair_share_then_stable_ties() -> None:
    usage = Usage(org={1: 1000.0, 2: 1.0})
    pending = [
        job(1, cls="batch", org_id=2, project_id=20),
        job(2, cls="standard", org_id=1, project_id=10),
        job(3, cls="standard", org_id=2, project_id=20),
        job(4, cls="standard", org_id=2, project_id=20, submitted=0.0),
    ]
    res = schedule(snap([node(1, free=[])], pending, usage=usage, size_weight=0.0))
    assert _order(res) == [3, 4, 2, 1]


def test_aging_prevents_starvation_under_stream_of_higher_class_jobs() -> None:
    # One GPU; every round a fresh production job arrives and the old batch job keeps waiting.
    # With aging, the batch job must win the GPU within a bounded number of rounds.
    batch = job(1, cls="batch", submitted=0.0, org_id=9, project_id=90)
    aging = 3600.0
    now = 0.0
    for k in range(100):
        now = 600.0 * (k + 1)
        fresh = job(100 + k, cls="production", submitted=now, org_id=1, project_id=10)
        res = schedule(snap([node(1, gpus=1)], [batch, fresh], now=now, aging_seconds_per_class=aging))
        (p,) = res.placements
        if p.job_id == 1:
            break
    else:
        raise AssertionError("batch job starved")
    assert now <= 3 * aging + 3600  # 3 class steps (production - batch) plus share/size weights


def test_aging_beats_a_stream_of_under_share_jobs() -> None:
    old = job(1, submitted=0.0, org_id=1, project_id=10)
    usage = Usage(org={1: 1e9, 2: 0.0})
    for k in range(200):
        now = 600.0 * (k + 1)
        fresh = job(100 + k, submitted=now, org_id=2, project_id=20)
        res = schedule(
            snap([node(1, gpus=1)], [old, fresh], now=now, usage=usage, aging_seconds_per_class=7200)
        )
        if res.placements[0].job_id == 1:
            return
    raise AssertionError("over-share job starved")


def test_running_jobs_count_in_the_tree() -> None:
    # Running work of org 1 is known to the adapter through usage; its users are still ranked.
    run = [running(50, ((1, (0,)),), org_id=1, project_id=10)]
    res = schedule(snap([node(1)], [job(1, org_id=1, project_id=10)], run))
    assert [p.job_id for p in res.placements] == [1]


def test_decaying_usage_half_life() -> None:
    from scheduling.core import DecayingUsage

    u = DecayingUsage(half_life_seconds=100.0)
    u.add("org", 80.0, now=0.0)
    assert u.value("org", 100.0) == 40.0
    u.add("org", 10.0, now=200.0)
    assert u.value("org", 200.0) == 30.0
    assert u.values_at(300.0) == {"org": 15.0}


def test_aging_grace_proportional_to_wall() -> None:
    from scheduling.core import Config
    from scheduling.core.fairshare import priority_value

    day = 86_400.0
    plain = Config(aging_seconds_per_class=day)
    graced = Config(aging_seconds_per_class=day, aging_grace_wall_factor=1.0)
    # A 2-day job that waited 1 day has not started aging yet; a 1-hour job has aged ~1 day.
    long_wait = priority_value(3, 0.5, 1, 2 * day, day, graced) - priority_value(
        3, 0.5, 1, 2 * day, 0, graced
    )
    short_wait = priority_value(3, 0.5, 1, 3600, day, graced) - priority_value(3, 0.5, 1, 3600, 0, graced)
    assert long_wait == 0.0
    assert abs(short_wait - (day - 3600) / day) < 1e-9
    assert (
        priority_value(3, 0.5, 1, 2 * day, day, plain) - priority_value(3, 0.5, 1, 2 * day, 0, plain) == 1.0
    )
    # Still uncapped: after its grace the long job ages like any other, so it cannot starve.
    assert priority_value(1, 0.0, 1, 2 * day, 30 * day, graced) > priority_value(5, 1.0, 1, 60, 0, graced)


def test_size_factor_on_gpu_hours_is_optional() -> None:
    from scheduling.core import size_factor

    assert size_factor(8, 3600) == size_factor(1, 3600)  # default: wall time only
    assert size_factor(8, 3600, 1.0) == size_factor(1, 8 * 3600, 1.0) < size_factor(1, 3600, 1.0)


def test_run_time_of_earlier_attempts_does_not_age_a_requeued_job() -> None:
    from scheduling.core import Config, job_priority

    day = 86_400.0
    cfg = Config(aging_seconds_per_class=day, fairshare_weight=0.0, size_weight=0.0)
    fresh = job(1, submitted=0.0, wall=3600.0)
    requeued = job(2, submitted=0.0, wall=3600.0, run_seconds=5 * day)
    assert job_priority(fresh, 6 * day, 3, 0.5, cfg, 3600.0) == 3 + 6.0
    assert job_priority(requeued, 6 * day, 3, 0.5, cfg, 3600.0) == 3 + 1.0


def test_response_ratio_ages_short_jobs_faster() -> None:
    from scheduling.core import Config
    from scheduling.core.fairshare import priority_value

    hour = 3600.0
    cfg = Config(
        response_ratio_weight=0.2, fairshare_weight=0.0, size_weight=0.0, aging_seconds_per_class=1e12
    )

    def gain(wall: float, waited: float) -> float:
        return priority_value(3, 0.0, 1, wall, waited, cfg) - priority_value(3, 0.0, 1, wall, 0.0, cfg)

    assert gain(hour, 0.0) == 0.0  # fresh jobs: classes stay strictly ordered
    # Same wait, ratio 1 + wait / wall: 1 h job waited 7 h -> 0.2 x log2(8) = 0.6 steps.
    assert gain(hour, 7 * hour) == pytest.approx(0.6, abs=1e-6)
    assert gain(7 * hour, 7 * hour) == pytest.approx(0.2, abs=1e-6)
    # The floor: a 1-minute job counts as 10 minutes.
    assert gain(60.0, 600.0) == gain(600.0, 600.0)
    # Off by default.
    assert priority_value(3, 0.0, 1, hour, 7 * hour, Config(aging_seconds_per_class=1e12)) == pytest.approx(
        priority_value(3, 0.0, 1, hour, 0.0, Config(aging_seconds_per_class=1e12)), abs=1e-6
    )
