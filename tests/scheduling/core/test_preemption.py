"""Preemption: only strictly lower-class jobs whose own flag allows it; min runtime; grace; no double
counting."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from scheduling.core import Config, PendingJob, PriorityClass, Quotas, Result, Skip, schedule
from scheduling.core import reasons as R
from tests.scheduling.core.helpers import job, node, running, snap

NOW = 10_000.0


def _full_node(cls: str = "batch", started: float = 0.0, **kw: object) -> list:
    return [running(50, ((1, tuple(range(8))),), cls=cls, started=started, wall=99_999, **kw)]


def test_higher_class_preempts_lower_with_grace() -> None:
    res = schedule(
        snap([node(1)], [job(1, gpus=8, cls="production")], _full_node(), now=NOW, grace_seconds=90)
    )
    (p,) = res.preemptions
    assert (p.job_id, p.attempt_id, p.for_job_id, p.grace_seconds) == (50, 500, 1, 90)
    # GPUs are not free until the victim exits: nothing is placed in this pass.
    assert res.placements == [] and res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION
    assert res.reservations[0].start_at == NOW + 90


def test_min_runtime_before_preemption() -> None:
    run = _full_node(started=NOW - 100)
    res = schedule(
        snap(
            [node(1)],
            [job(1, gpus=8, cls="production")],
            run,
            now=NOW,
            min_runtime_before_preemption_seconds=600,
        )
    )
    assert res.preemptions == []
    run = _full_node(started=NOW - 700)
    res = schedule(
        snap(
            [node(1)],
            [job(1, gpus=8, cls="production")],
            run,
            now=NOW,
            min_runtime_before_preemption_seconds=600,
        )
    )
    assert len(res.preemptions) == 1


def test_exemption_grows_with_each_earlier_preemption() -> None:
    """A stream of different preemptors could otherwise stop one long victim every min runtime."""

    def preempted(ran: float, times: int, growth: float) -> bool:
        run = _full_node(started=NOW - ran, times_preempted=times)
        res = schedule(
            snap([node(1)], [job(1, gpus=8, cls="production")], run, now=NOW,
                 min_runtime_before_preemption_seconds=600, preemption_exempt_growth=growth,
                 preemption_exempt_after=0)
        )
        return bool(res.preemptions)

    assert preempted(700, times=3, growth=1.0)  # off: the minimum runtime only
    assert not preempted(700, times=1, growth=2.0)  # 600 x 2
    assert preempted(1300, times=1, growth=2.0)
    assert not preempted(4700, times=3, growth=2.0)  # 600 x 8
    assert preempted(4900, times=3, growth=2.0)
    assert preempted(700, times=0, growth=2.0)  # never preempted: the minimum runtime only


def test_exemption_growth_below_one_is_refused() -> None:
    for bad in (0.5, 0.0, -2.0, math.nan):
        with pytest.raises(ValueError, match="preemption_exempt_growth must be >= 1"):
            Config(preemption_exempt_growth=bad)
    assert Config(preemption_exempt_growth=1.0).preemption_exempt_growth == 1.0


def test_exemption_growth_starts_after_the_given_number_of_preemptions() -> None:
    """Jobs preempted a few times keep the minimum runtime; only repeatedly stopped ones grow."""

    def preempted(ran: float, times: int, after: int) -> bool:
        run = _full_node(started=NOW - ran, times_preempted=times)
        res = schedule(
            snap([node(1)], [job(1, gpus=8, cls="production")], run, now=NOW,
                 min_runtime_before_preemption_seconds=600, preemption_exempt_growth=2.0,
                 preemption_exempt_after=after)
        )
        return bool(res.preemptions)

    assert preempted(700, times=3, after=3)  # not past the threshold: the minimum runtime only
    assert preempted(700, times=2, after=3)
    assert not preempted(1100, times=4, after=3)  # 600 x 2 ** (4 - 3)
    assert preempted(1300, times=4, after=3)
    assert not preempted(2300, times=5, after=3)  # 600 x 4
    assert preempted(2500, times=5, after=3)
    assert not preempted(4700, times=3, after=0)  # 0: today's growth, 600 x 8
    assert preempted(4900, times=3, after=0)


def test_exemption_after_must_be_a_non_negative_int() -> None:
    for bad in (-1, 1.5, math.nan):
        with pytest.raises(ValueError, match="preemption_exempt_after must be an int >= 0"):
            Config(preemption_exempt_after=bad)  # type: ignore[arg-type]
    assert Config(preemption_exempt_after=10).preemption_exempt_after == 10


def test_default_exemption_grows_from_the_sixth_attempt() -> None:
    """ADR 0007: growth 2 after 5 preemptions; a job stopped up to 5 times keeps the 600 s."""
    assert (Config().preemption_exempt_growth, Config().preemption_exempt_after) == (2.0, 5)

    def preempted(ran: float, times: int) -> bool:
        run = _full_node(started=NOW - ran, times_preempted=times)
        res = schedule(
            snap([node(1)], [job(1, gpus=8, cls="production")], run, now=NOW,
                 min_runtime_before_preemption_seconds=600)
        )
        return bool(res.preemptions)

    assert preempted(700, times=5)  # 5 earlier preemptions: still the minimum runtime
    assert not preempted(1100, times=6)  # 600 x 2
    assert preempted(1300, times=6)
    assert not preempted(19_100, times=10)  # 600 x 2 ** 5 = 5 h 20 min
    assert preempted(19_300, times=10)


def test_never_preempts_non_preemptible_same_or_higher_class() -> None:
    for cls, preemptible, pending_cls in [
        ("batch", False, "production"),  # job opted out
        ("production", True, "production"),  # same class (and no class outranks production)
        ("standard", True, "standard"),  # same class
        ("premium", True, "standard"),  # higher class
        ("interactive", True, "batch"),  # batch cannot preempt (class config)
    ]:
        run = _full_node(cls=cls, preemptible=preemptible)
        res = schedule(snap([node(1)], [job(1, gpus=8, cls=pending_cls)], run, now=NOW))
        assert res.preemptions == [], (cls, preemptible, pending_cls)


# A non-preemptible class in the middle of the ladder: only there can a volunteer matter (in the
# default ladder the one non-preemptible class, production, has no class above it).
_MIDDLE_LADDER = (
    PriorityClass("top", 3, preemptible_by_higher=False, can_preempt=True),
    PriorityClass("guarded", 2, preemptible_by_higher=False, can_preempt=True),
    PriorityClass("low", 1, preemptible_by_higher=True, can_preempt=False),
)


@pytest.mark.parametrize(("volunteered", "preempted"), [(True, [50]), (False, [])])
def test_the_jobs_own_flag_decides_even_in_a_non_preemptible_class(
    volunteered: bool, preempted: list[int]
) -> None:
    """docs/api.md: a job of a non-preemptible class may volunteer `preemptible: true`; the core
    must then treat it as a candidate like any other (its class's flag is only the default)."""
    run = _full_node(cls="guarded", preemptible=volunteered)
    pending = [job(1, gpus=8, cls="top")]
    res = schedule(snap([node(1)], pending, run, now=NOW, priority_classes=_MIDDLE_LADDER))
    assert [p.job_id for p in res.preemptions] == preempted
    assert all(p.for_job_id == 1 for p in res.preemptions)


def test_signalled_victims_are_not_signalled_twice_nor_counted_twice() -> None:
    run = [running(50, ((1, tuple(range(8))),), started=0, wall=99_999, preemption_requested_at=NOW - 10)]
    pending = [job(1, gpus=8, cls="production", submitted=0), job(2, gpus=8, cls="production", submitted=1)]
    res = schedule(snap([node(1)], pending, run, now=NOW))
    assert res.preemptions == []  # job 1 counts on the already-exiting victim
    assert res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION
    assert res.wait_reasons[2] != R.WAITING_FOR_PREEMPTION  # the same GPUs are not promised twice


def test_fewest_lowest_class_victims() -> None:
    nodes = [node(1), node(2)]
    run = [
        # node 1: one standard job on all 8 GPUs
        running(60, ((1, tuple(range(8))),), cls="standard", started=0, wall=99_999),
        # node 2: two interactive jobs of 4 GPUs each
        running(70, ((2, (0, 1, 2, 3)),), cls="interactive", started=0, wall=99_999),
        running(71, ((2, (4, 5, 6, 7)),), cls="interactive", started=0, wall=99_999),
    ]
    res = schedule(snap(nodes, [job(1, gpus=8, cls="production")], run, now=NOW))
    assert [p.job_id for p in res.preemptions] == [60]  # one victim beats two
    res = schedule(snap(nodes, [job(1, gpus=4, cls="production")], run, now=NOW))
    assert len(res.preemptions) == 1 and res.preemptions[0].job_id in (70, 71)  # lowest class


def test_prefers_over_share_victims() -> None:
    from scheduling.core import Usage

    run = [
        running(70, ((1, (0, 1, 2, 3)),), cls="batch", started=0, wall=99_999, org_id=7, project_id=70),
        running(71, ((1, (4, 5, 6, 7)),), cls="batch", started=0, wall=99_999, org_id=8, project_id=80),
    ]
    usage = Usage(org={7: 10.0, 8: 1000.0})
    res = schedule(snap([node(1)], [job(1, gpus=4, cls="production")], run, now=NOW, usage=usage))
    assert [p.job_id for p in res.preemptions] == [71]


def test_no_preemption_in_baseline_policies() -> None:
    for policy in ("fifo", "fifo_backfill"):
        res = schedule(
            snap([node(1)], [job(1, gpus=8, cls="production")], _full_node(), now=NOW, policy=policy)
        )
        assert res.preemptions == []


def test_victim_that_would_requeue_ahead_is_not_preempted() -> None:
    # The standard victim has waited long enough (aging) to outrank a fresh production job if it
    # were queued again: preempting it would only bounce the GPUs back and forth.
    aged = [
        running(
            50, ((1, tuple(range(8))),), cls="standard", started=NOW - 1000, wall=99_999, submitted_at=0.0
        )
    ]
    pending = [job(1, gpus=8, cls="production", submitted=NOW)]
    res = schedule(snap([node(1)], pending, aged, now=NOW, aging_seconds_per_class=NOW / 3))
    assert res.preemptions == []
    fresh = [replace(aged[0], submitted_at=NOW - 1000)]
    res = schedule(snap([node(1)], pending, fresh, now=NOW, aging_seconds_per_class=NOW / 3))
    assert [p.job_id for p in res.preemptions] == [50]


def test_multi_node_gang_preempts_within_one_ib_group() -> None:
    nodes = [node(1, ib_group="a"), node(2, ib_group="a"), node(3, ib_group="b")]
    run = [
        running(60, ((1, tuple(range(8))),), cls="batch", started=0, wall=99_999),
        running(61, ((3, tuple(range(8))),), cls="batch", started=0, wall=99_999),
    ]
    res = schedule(snap(nodes, [job(1, gpus=16, cls="production")], run, now=NOW))
    assert [p.job_id for p in res.preemptions] == [60]
    assert {n for n, _ in res.reservations[0].allocations} == {1, 2}


def test_min_gain_spares_a_victim_about_to_finish() -> None:
    pending = [job(1, gpus=8, cls="production", wall=3600)]
    # 89,999 s left >= 2 x 3,600: worth stopping.
    long_left = _full_node(started=0)
    res = schedule(snap([node(1)], pending, long_left, now=NOW, preemption_min_gain=2.0))
    assert [p.job_id for p in res.preemptions] == [50]
    # 2,000 s left < 2 x 3,600: the victim ends sooner than the preemptor would; wait instead.
    short_left = [running(50, ((1, tuple(range(8))),), cls="batch", started=0, wall=12_000)]
    res = schedule(snap([node(1)], pending, short_left, now=NOW, preemption_min_gain=2.0))
    assert res.preemptions == []
    assert res.wait_reasons[1] != R.WAITING_FOR_PREEMPTION
    # Without the rule the same victim is taken.
    res = schedule(snap([node(1)], pending, short_left, now=NOW, preemption_min_gain=0.0))
    assert [p.job_id for p in res.preemptions] == [50]


def test_preemption_budget_per_pass() -> None:
    run = [
        running(50, ((1, tuple(range(8))),), cls="batch", started=0, wall=99_999),
        running(51, ((2, tuple(range(8))),), cls="batch", started=0, wall=99_999),
    ]
    pending = [job(1, gpus=8, cls="production", submitted=0), job(2, gpus=8, cls="production", submitted=1)]
    res = schedule(snap([node(1), node(2)], pending, run, now=NOW))
    assert len(res.preemptions) == 2
    res = schedule(snap([node(1), node(2)], pending, run, now=NOW, max_preemptions_per_pass=1))
    assert [p.for_job_id for p in res.preemptions] == [1]
    assert res.wait_reasons[2] != R.WAITING_FOR_PREEMPTION


def test_a_victim_past_its_wall_limit_can_still_be_preempted_without_a_gain_rule() -> None:
    run = [running(50, ((1, tuple(range(8))),), cls="batch", started=0, wall=3600)]
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], run, now=NOW, preemption_min_gain=0.0))
    assert [p.job_id for p in res.preemptions] == [50]
    # The default gain rule spares it: it is past its limit, the agent is about to stop it anyway.
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], run, now=NOW))
    assert res.preemptions == []


def test_time_running_does_not_age_a_victim() -> None:
    # Aging rewards waiting. A standard job that started at once and has run for a long time has
    # waited nothing, so a production job may preempt it. Before this rule its run time counted
    # as waiting (3 class steps here) and long runs became immune to preemption.
    long_run = [
        running(50, ((1, tuple(range(8))),), cls="standard", started=0.0, wall=99_999, submitted_at=0.0)
    ]
    pending = [job(1, gpus=8, cls="production", submitted=NOW)]
    res = schedule(snap([node(1)], pending, long_run, now=NOW, aging_seconds_per_class=NOW / 3))
    assert [p.job_id for p in res.preemptions] == [50]


def test_earlier_attempts_run_time_does_not_age_a_victim() -> None:
    # Submitted at 0, ran 9,000 s in an earlier attempt, re-started at NOW - 1000: it waited 0 s.
    run = running(
        50, ((1, tuple(range(8))),), cls="standard", started=NOW - 1000, wall=99_999, submitted_at=0.0
    )
    pending = [job(1, gpus=8, cls="production", submitted=NOW)]
    counted = replace(run, prior_run_seconds=NOW - 1000)
    res = schedule(snap([node(1)], pending, [counted], now=NOW, aging_seconds_per_class=NOW / 3))
    assert [p.job_id for p in res.preemptions] == [50]
    res = schedule(snap([node(1)], pending, [run], now=NOW, aging_seconds_per_class=NOW / 3))
    assert res.preemptions == []  # unknown history: its 9,000 s before this start count as waiting


def test_victim_priority_uses_the_wall_it_will_queue_with() -> None:
    """A victim running on a slow type (long wall there) but queued with its first choice's short
    wall must be judged with the short one: judged on the long one it looks preemptable, then
    re-queues ahead of its own preemptor and takes its GPUs back (the Philly replay's storm)."""

    ranks = {c.name: c.rank for c in Config().priority_classes}
    steps = ranks["production"] - ranks["standard"]
    started = NOW - 1000  # waited 9,000 s before starting: exactly `steps` classes of aging
    victim = running(50, ((1, tuple(range(8))),), cls="standard", started=started, wall=99_999,
                     submitted_at=0.0)
    pending = [job(1, gpus=8, cls="production", submitted=NOW)]

    def preempted(v: object) -> list[int]:
        res = schedule(snap([node(1)], pending, [v], now=NOW, aging_seconds_per_class=started / steps))
        return [p.job_id for p in res.preemptions]

    assert preempted(victim) == [50]  # on its node's long wall it ranks below the preemptor
    walls = (("T4", 60.0), ("H100", 99_999.0))
    queued = replace(victim, gpu_types=("T4", "H100"), max_wall_by_type=walls)
    assert preempted(queued) == []  # queued, its first choice's short wall ranks it above
    # The first *acceptable* type, as the queue decides it: a memory floor above the T4's 16 GB
    # leaves H100 first, whose wall is the long one again.
    assert preempted(replace(queued, gpu_memory_gb=40)) == [50]


def _wait_detail(res: Result, job_id: int) -> str:
    (skip,) = [d for d in res.decisions if isinstance(d, Skip) and d.job_id == job_id]
    return skip.detail


def test_a_blocked_preemptor_is_told_when_its_victims_stop_being_exempt() -> None:
    """The wait detail names the end of the exemption: plain minimum runtime, or grown after the
    victim's 5th preemption (600 s x 2 ** (7 - 5) for a job preempted 7 times)."""
    young = _full_node(started=NOW - 100)
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], young, now=NOW))
    assert res.preemptions == [] and res.wait_reasons[1] == R.RESOURCES
    # NOW - 100 + 600 = 10,500 s after the epoch
    first = "; the first lower-class job there stops being exempt from preemption at 1970-01-01T02:55:00Z"
    assert _wait_detail(res, 1).endswith(first)

    stopped_often = _full_node(started=NOW - 1000, times_preempted=7)
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], stopped_often, now=NOW))
    assert res.preemptions == []
    assert _wait_detail(res, 1).endswith("exempt from preemption at 1970-01-01T03:10:00Z")  # 11,400 s


def test_no_exemption_note_for_jobs_that_end_before_their_exemption() -> None:
    """QA: a 45-s job was named as stopping being exempt at the end of its 10-minute minimum
    runtime; it reaches its wall limit first, so it never becomes a victim."""
    short = [running(50, ((1, tuple(range(8))),), cls="batch", started=NOW - 10, wall=45.0)]
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], short, now=NOW))
    assert res.preemptions == [] and "exempt" not in _wait_detail(res, 1)


def test_no_exemption_note_when_nothing_lower_could_be_preempted() -> None:
    # The runner is of the same class (not a candidate at any age) and the waiting batch job may
    # not preempt at all: neither detail mentions an exemption.
    same_class = _full_node(cls="production", started=NOW - 100)
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="production")], same_class, now=NOW))
    assert res.wait_reasons[1] == R.RESOURCES and "exempt" not in _wait_detail(res, 1)
    young_batch = _full_node(started=NOW - 100)
    res = schedule(snap([node(1)], [job(2, gpus=8, cls="interactive")], young_batch, now=NOW))
    assert res.preemptions == [] and "exempt" not in _wait_detail(res, 2)


def _skip(res: Result, job_id: int) -> Skip:
    return next(s for s in res.skips if s.job_id == job_id)


# -- preemption within the preemptor's own quota (Kueue: withinClusterQueue: LowerPriority) ------

def _h100(cls: str) -> PendingJob:
    return job(1, gpus=4, gpu_types=("H100",), cls=cls)


def _at_quota(**quota: dict) -> tuple[list, list, Quotas]:
    """Org 1 uses its 8-H100 quota with a batch job on node 1; node 2 is idle."""
    run = [running(50, ((1, tuple(range(8))),), cls="batch", org_id=1, project_id=10, wall=99_999)]
    return [node(1), node(2)], run, Quotas(**quota)


def test_a_job_at_its_org_quota_preempts_its_own_orgs_lower_class_job() -> None:
    nodes, run, quotas = _at_quota(org={(1, "H100"): 8})
    res = schedule(snap(nodes, [_h100("production")], run, quotas=quotas, now=NOW))
    (p,) = res.preemptions
    assert (p.job_id, p.for_job_id, p.reason_code) == (50, 1, R.PREEMPTED_FOR_QUOTA)
    assert res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION
    assert _skip(res, 1).detail == "on H100: waiting for job 50 to exit (own quota)"
    # Next pass, the victim still exiting: counted on, not signalled again.
    signalled = [replace(run[0], preemption_requested_at=NOW)]
    res = schedule(snap(nodes, [_h100("production")], signalled, quotas=quotas, now=NOW + 5))
    assert res.preemptions == [] and res.wait_reasons[1] == R.WAITING_FOR_PREEMPTION
    # Once it has exited the job is placed (the idle node is free all along).
    res = schedule(snap(nodes, [_h100("production")], [], quotas=quotas, now=NOW + 200))
    assert [p.job_id for p in res.placements] == [1]


def test_quota_preemption_never_touches_another_tenant_or_a_higher_class() -> None:
    nodes, run, quotas = _at_quota(org={(1, "H100"): 8})
    other_org = [replace(run[0], org_id=2, project_id=20)]
    own_premium = [replace(run[0], priority_class="premium")]
    for victims, cls in ((other_org, "production"), (own_premium, "standard")):
        # Against another org's job the quota is not even reached; either way nothing is stopped.
        res = schedule(snap(nodes, [_h100(cls)], victims, quotas=quotas, now=NOW))
        assert res.preemptions == []
    res = schedule(snap(nodes, [_h100("standard")], own_premium, quotas=quotas, now=NOW))
    assert res.wait_reasons[1] == R.QUOTA
    # A class that may not preempt waits for its quota like before.
    res = schedule(snap(nodes, [_h100("batch")], run, quotas=quotas, now=NOW))
    assert res.preemptions == [] and res.wait_reasons[1] == R.QUOTA


def test_a_project_quota_takes_the_projects_own_jobs_first() -> None:
    nodes = [node(1), node(2), node(3)]
    run = [
        running(50, ((1, tuple(range(8))),), cls="batch", org_id=1, project_id=11, wall=99_999),
        running(60, ((2, (0, 1, 2, 3)),), cls="standard", org_id=1, project_id=10, wall=99_999),
    ]
    quotas = Quotas(project={(10, "H100"): 4})
    res = schedule(snap(nodes, [_h100("production")], run, quotas=quotas, now=NOW))
    # Job 50 is of a lower class, but it is another project's: only the project's own job frees
    # the project's quota.
    assert [(p.job_id, p.reason_code) for p in res.preemptions] == [(60, R.PREEMPTED_FOR_QUOTA)]


def test_quota_preemption_respects_the_minimum_runtime() -> None:
    nodes, run, quotas = _at_quota(org={(1, "H100"): 8})
    young = [replace(run[0], started_at=NOW - 100)]
    res = schedule(snap(nodes, [_h100("production")], young, quotas=quotas, now=NOW,
                        min_runtime_before_preemption_seconds=600))
    assert res.preemptions == [] and res.wait_reasons[1] == R.QUOTA
    # It waits with its quota reserved from when job 50 reaches its max wall.
    assert _skip(res, 1).detail == (
        "concurrent-GPU quota: H100 org 8 of 8 in use; needs 4; quota reserved for it from "
        f"{R.utc_time(NOW - 100 + 99_999)} on H100"
    )


def test_the_exemption_note_names_only_jobs_on_nodes_the_gang_fits() -> None:
    """QA: an 8-GPU job was pointed at a young job on a 4-GPU node, which could never make room
    for it; the note now names the job on the 8-GPU node (exempt until NOW - 100 + 600)."""
    run = [
        running(60, ((2, (0, 1, 2, 3)),), cls="batch", started=NOW - 500),  # 4-GPU node: sooner
        running(61, ((1, tuple(range(8))),), cls="batch", started=NOW - 100),
    ]
    nodes = [node(1), node(2, gpus=4)]
    res = schedule(snap(nodes, [job(1, gpus=8, cls="production")], run, now=NOW))
    assert res.preemptions == []
    assert _wait_detail(res, 1).endswith("exempt from preemption at 1970-01-01T02:55:00Z")


def test_a_same_class_job_is_never_a_victim_even_beside_a_lower_one() -> None:
    """Mutation testing round 2: the node holds a lower-class job (so the node is searched) and a
    same-class one; the pending job needs both halves, so nothing may be preempted."""
    run = [running(50, ((1, (0, 1, 2, 3)),), cls="batch", started=0.0, wall=99_999),
           running(51, ((1, (4, 5, 6, 7)),), cls="standard", started=0.0, wall=99_999)]
    res = schedule(snap([node(1)], [job(1, gpus=8, cls="standard", submitted=NOW)], run, now=NOW))
    assert res.preemptions == []
    # Half the node is enough: only the lower-class job is stopped.
    res = schedule(snap([node(1)], [job(1, gpus=4, cls="standard", submitted=NOW)], run, now=NOW))
    assert [p.job_id for p in res.preemptions] == [50]
