"""`queue_order`: the queue as the next pass walks it, each job's priority explained term by term."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core import Config, Shares, Snapshot, Usage, queue_order, schedule
from scheduling.core.fairshare import priority_terms, priority_value
from tests.scheduling.core.helpers import job, node, running, snap
from tests.scheduling.core.test_properties import snapshots


@settings(max_examples=120, deadline=None)
@given(snapshots())
def test_order_is_the_order_the_pass_decides_in_and_terms_add_up(s: Snapshot) -> None:
    standings = queue_order(s)
    decided = [d.job_id for d in schedule(s).decisions if not hasattr(d, "for_job_id")]
    assert [x.job_id for x in standings] == decided
    assert [x.position for x in standings] == list(range(1, len(standings) + 1))
    for x in standings:
        assert sum(x.terms) == x.priority  # exactly: the same additions in the same order
    priorities = [x.priority for x in standings]
    if s.config.policy == "fair":
        assert priorities == sorted(priorities, reverse=True)
    else:
        assert set(priorities) <= {0.0}


@settings(max_examples=300, deadline=None)
@given(
    rank=st.integers(0, 5),
    fs=st.floats(0.01, 1.0),
    gpus=st.integers(1, 64),
    wall=st.floats(1.0, 1e7),
    waited=st.floats(0.0, 1e8),
    rr=st.sampled_from((0.0, 0.2, 1.0)),
)
def test_terms_sum_to_the_priority_formula_exactly(
    rank: int, fs: float, gpus: int, wall: float, waited: float, rr: float
) -> None:
    cfg = Config(response_ratio_weight=rr)
    terms = priority_terms(rank, fs, gpus, wall, waited, cfg)
    assert sum(terms) == priority_value(rank, fs, gpus, wall, waited, cfg)
    assert terms.class_rank == rank and terms.response_ratio >= 0.0


def test_a_job_behind_an_older_one_is_told_what_it_lacks() -> None:
    # Same class; org 1 used 3x what org 2 used, so org 2's job goes first despite being newer.
    pending = [
        job(1, submitted=0.0, org_id=1, project_id=10), job(2, submitted=5_000.0, org_id=2, project_id=20),
    ]
    usage = Usage(org={1: 3_000.0, 2: 1_000.0}, project={10: 3_000.0, 20: 1_000.0},
                  user={(10, 100): 3_000.0, (20, 100): 1_000.0})
    first, second = queue_order(snap([node(1, free=[])], pending, usage=usage, aging_seconds_per_class=1e9))
    assert (first.job_id, second.job_id) == (2, 1)
    assert first.fair_share_factor == 1.0 and second.fair_share_factor == 0.5
    assert first.terms.fair_share - second.terms.fair_share == 0.3 * 0.5
    # The org level: equal shares, 25 % and 75 % of the usage; alone in their projects and as users.
    org, project, user = second.levels
    assert (org.share, org.usage, org.fair_share) == (0.5, 0.75, 0.5 / 0.75)
    assert (project.share, project.usage) == (user.share, user.usage) == (1.0, 1.0)
    assert second.waited_seconds == 10_000.0 and first.waited_seconds == 5_000.0


def test_running_users_count_as_siblings_and_runs_do_not_age() -> None:
    # Job 1 ran 2,000 s in an earlier attempt: aging counts only the rest of its time since submission.
    pending = [job(1, submitted=0.0, run_seconds=2_000.0)]
    run = [running(50, ((1, (0,)),), org_id=2, project_id=20, user_id=200)]
    usage = Usage(org={2: 500.0}, project={20: 500.0}, user={(20, 200): 500.0})
    (x,) = queue_order(snap([node(1)], pending, run, usage=usage))
    assert x.waited_seconds == 8_000.0
    org_level = x.levels[0]
    assert org_level.share == 0.5 and org_level.usage == 0.0 and math.isinf(org_level.fair_share)


def test_fifo_orders_by_submission_with_no_terms() -> None:
    pending = [job(1, submitted=50.0), job(2, cls="production", submitted=10.0)]
    standings = queue_order(snap([node(1)], pending, policy="fifo"))
    assert [x.job_id for x in standings] == [2, 1]
    assert all(x.priority == 0.0 and sum(x.terms) == 0.0 for x in standings)


def test_unknown_shares_default_to_one() -> None:
    pending = [job(1, org_id=1), job(2, org_id=2, project_id=20)]
    standings = queue_order(snap([node(1)], pending, shares=Shares(org={2: 3.0})))
    assert {x.job_id: x.levels[0].share for x in standings} == {1: 0.25, 2: 0.75}
