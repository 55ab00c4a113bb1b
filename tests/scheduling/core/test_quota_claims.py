"""Quota reservations, second review: claims judged at the right instants, quota preemptions that
stop no more than needed, turns per scope, multi-type jobs. Each test failed on f0982df (the
review's repros) or killed a mutant that the suite let live (marked)."""
from __future__ import annotations

from typing import Any

from scheduling.core import Node, PendingJob, Quotas, schedule
from tests.scheduling.core.helpers import job, node, running, snap
from tests.scheduling.core.test_shortcuts import _without_shortcuts

NOW = 10_000.0
OLD = NOW - 7_200


def _h100(jid: int, gpus: int, cls: str = "batch", wall: float = 86_400.0, **kw: Any) -> PendingJob:
    return job(jid, gpus=gpus, gpu_types=kw.pop("gpu_types", ("H100",)), cls=cls,
               submitted=NOW - 100 + jid, wall=wall, **kw)


def test_signalled_job_the_plan_cannot_use_is_not_counted_as_running_on() -> None:
    """V (standard, org 1) was signalled in an earlier pass and leaves at NOW + 90. Q (standard)
    cannot count V as a victim (same class), yet _peak counts V as running for ever, so Q stops
    batch job W although at NOW + 120 W + Q = 8 <= 8."""
    v = running(50, ((1, (0, 1, 2, 3)),), cls="standard", org_id=1, project_id=10, started=OLD, wall=8e4,
                preemption_requested_at=NOW - 30)
    w = running(51, ((1, (4, 5, 6, 7)),), cls="batch", org_id=1, project_id=10, started=OLD, wall=8e4)
    q = _h100(1, gpus=4, cls="standard", wall=3_600)
    res = schedule(snap([node(1), node(2)], [q], [v, w], quotas=Quotas(org={(1, "H100"): 8}), now=NOW))
    assert res.preemptions == [], [(p.job_id, p.for_job_id) for p in res.preemptions]


def test_signalled_victim_taken_by_a_first_preemptor_is_not_counted_twice() -> None:
    """V (signalled before) is A's free victim; B's deficit counts V as running on AND A's claim."""
    v = running(50, ((1, (0, 1, 2, 3)),), cls="batch", org_id=1, project_id=10, started=OLD, wall=8e4,
                preemption_requested_at=NOW - 30)
    w1 = running(51, ((1, (4, 5, 6, 7)),), cls="batch", org_id=1, project_id=10, started=OLD, wall=8e4)
    w2 = running(52, ((2, (0, 1, 2, 3)),), cls="batch", org_id=1, project_id=10, started=OLD, wall=8e4)
    pending = [_h100(1, gpus=4, cls="production", wall=3_600), _h100(2, gpus=4, cls="production", wall=3_600)]
    res = schedule(snap([node(1), node(2), node(3)], pending, [v, w1, w2],
                        quotas=Quotas(org={(1, "H100"): 12}), now=NOW))
    stopped = {p.job_id: p.for_job_id for p in res.preemptions}
    # At NOW + 120: V gone, W1 + W2 (8) + A (4) + B (4) = 16 > 12: one of W1/W2 must stop, not both.
    assert len(stopped) == 1, stopped


def test_a_multi_type_job_keeps_its_quota_room_on_the_type_its_quota_holds_it_back_on() -> None:
    """J accepts H100 (org quota 8, room from NOW + 3,000) or A100 (no quota, busy until
    NOW + 50,000). It is not quota-blocked on *every* type, so it gets no quota reservation on H100,
    and a later batch job takes the H100 quota room J would have had from NOW + 3,000."""
    r = running(50, ((1, (0, 1, 2, 3)),), org_id=1, project_id=10, started=NOW - 600, wall=3_600)
    o = running(60, ((2, tuple(range(8))),), cls="production", org_id=2, project_id=20, started=NOW - 600,
                wall=50_000, preemptible=False, gpu_type="A100")
    j = _h100(1, gpus=8, cls="production", wall=3_600, gpu_types=("H100", "A100"))
    c = _h100(2, gpus=4)
    quotas = Quotas(org={(1, "H100"): 8})
    res = schedule(snap([node(1), node(2, "A100")], [j, c], [r, o], quotas=quotas, now=NOW))
    assert res.placements == [], [(p.job_id, p.gpu_type) for p in res.placements]


def test_an_easy_reservation_is_made_when_the_quota_room_is_there_at_its_start() -> None:
    """Org 1 (quota 8) runs R1 (2 GPUs, until NOW + 1,000) and R2 (2 GPUs, until NOW + 2,000).
    Job 1 needs 6: quota claim from NOW + 1,000. Job 2 (2 GPUs, 500 s) gets GPUs at NOW + 2,500
    only; there it fits: 0 running + 6 claimed + 2 = 8. reserve() judges it as if running from now
    (R2 counted at job 1's claim start: 2 + 6 + 2 > 8) and refuses its EASY reservation."""
    run = [
        running(50, ((1, (0, 1)),), org_id=1, project_id=10, started=NOW - 2_600, wall=3_600),
        running(51, ((1, (2, 3)),), org_id=1, project_id=10, started=NOW - 1_600, wall=3_600),
        running(60, ((2, tuple(range(8))),), org_id=2, project_id=20, started=NOW - 1_100, wall=3_600,
                preemptible=False),
    ]
    nodes = [node(1, region="r1"), node(2, region="r2")]
    head = _h100(1, gpus=6, cls="production", regions=("r1",))
    short = _h100(2, gpus=2, cls="premium", wall=500, regions=("r2",))
    res = schedule(snap(nodes, [head, short], run, quotas=Quotas(org={(1, "H100"): 8}), now=NOW))
    assert [(r.job_id, r.kind) for r in res.reservations] == [(1, "quota"), (2, "backfill")], (
        res.reservations, res.skips)


def test_a_quota_preemption_does_not_stop_a_job_that_reaches_its_wall_first() -> None:
    """preemption_min_gain=0: W ends at NOW + 60 by itself; _peak (from NOW + 120) does not count it,
    but quota_plan counts its 4 GPUs as freed: W is signalled for nothing and job 1's reservation
    from NOW + 120 has 4 + 8 > 8 (X still runs)."""
    w = running(50, ((1, (0, 1, 2, 3)),), org_id=1, project_id=10, started=NOW - 600, wall=660)
    x = running(51, ((1, (4, 5, 6, 7)),), org_id=1, project_id=10, started=OLD, wall=8e4)
    q = _h100(1, gpus=8, cls="production", wall=3_600)
    res = schedule(snap([node(1), node(2)], [q], [w, x], quotas=Quotas(org={(1, "H100"): 8}), now=NOW,
                        preemption_min_gain=0.0))
    assert 50 not in {p.job_id for p in res.preemptions}, [(p.job_id, p.for_job_id) for p in res.preemptions]


def test_a_project_quota_reservation_does_not_take_the_orgs_turn() -> None:
    """Docs: 'a quota reservation on the other level does not take a job's turn'. Job 1 is held
    back by project 10's quota only; its 'quota' claim is also filed on org 1, so job 2 (project
    11, held back by the org quota) gets no reservation, and batch job 3 (project 11) takes the
    org room job 2 waits for."""
    run = [
        running(50, ((1, (0, 1)),), org_id=1, project_id=10, started=NOW - 600, wall=3_600),  # until NOW+3000
        running(51, ((1, (2, 3)),), org_id=1, project_id=11, started=NOW - 600, wall=4_600),  # until NOW+4000
    ]
    quotas = Quotas(org={(1, "H100"): 8}, project={(10, "H100"): 2})
    a = _h100(1, gpus=2, cls="production", project_id=10)  # project 10: 2 + 2 > 2
    b = _h100(2, gpus=6, cls="premium", project_id=11)  # org: 4 + 6 > 8
    c = _h100(3, gpus=2, project_id=11)  # org: 4 + 2 <= 8; at NOW+3000: 2 + 2(a) + 2 <= 8
    res = schedule(snap([node(1), node(2)], [a, b, c], run, quotas=quotas, now=NOW))
    assert 2 in {r.job_id for r in res.reservations}


def test_the_shape_cache_never_gives_a_job_another_jobs_note() -> None:
    """test_shortcuts_do_not_change_the_result fails on this (found at random; minimised). Job 8 (any
    type) is quota-trimmed to H100, so it shares job 12's shape (("H100",), (), 3); without the
    nothing_can_start shortcut job 12 (80 GB: H100 only) gets job 8's cached detail, whose unfit
    note names the draining A100 that job 12 cannot use."""
    nodes = [node(0, "H100", 1), Node(2, "A100", 1, frozenset({0}), region="eu", state="draining")]
    kw: dict[str, Any] = dict(org_id=1, project_id=1, user_id=1, submitted=100_000.0, wall=60.0)
    pending = [job(8, 3, cls="premium", **kw), job(10, 1, cls="production", **kw),
               job(12, 3, cls="premium", gpu_memory_gb=80, **kw), job(13, 1, cls="production", **kw)]
    s = snap(nodes, pending, now=100_000.0, quotas=Quotas(project={(1, "A100"): 1, (1, "T4"): 1}),
             min_runtime_before_preemption_seconds=0.0, preemption_exempt_growth=1.0,
             preemption_exempt_after=0, max_preemption_attempts=0, preemption_min_gain=0.0)
    assert schedule(s) == _without_shortcuts(s)


def test_a_job_placed_in_the_pass_is_counted_at_a_claim_start_after_it() -> None:
    """(Mutant: take() leaving QuotaBook._index stale.) Job 1's claim of 10 from NOW + 1,000; job 2
    fits beside it (0 + 10 + 2 = 12); job 3 would not beside job 2 (2 + 10 + 2 > 12)."""
    r = running(50, ((1, tuple(range(8))),), org_id=1, project_id=10, started=NOW - 2_600, wall=3_600)
    pending = [_h100(1, 10, cls="production"), _h100(2, 2), _h100(3, 2)]
    quotas = Quotas(org={(1, "H100"): 12})
    nodes = [node(i, ib_group="ib1") for i in (1, 2, 3)]  # job 1's 10 GPUs span nodes of one group
    res = schedule(snap(nodes, pending, [r], quotas=quotas, now=NOW))
    assert [p.job_id for p in res.placements] == [2]


def test_a_priority_preemption_whose_run_would_cross_a_quota_claim_is_not_made() -> None:
    """(Mutant: try_preempt's quota check dropped.) Job 2 would end before job 1's claim if it
    started now (2,950 s < 3,000 s), not if it starts when its victim has gone (NOW + 120)."""
    run = [
        running(50, ((1, (0, 1, 2, 3)),), org_id=1, project_id=10, started=NOW - 600, wall=3_600),
        running(60, ((1, (4, 5, 6, 7)),), cls="batch", org_id=2, project_id=20, started=OLD, wall=8e4),
        running(61, ((2, tuple(range(8))),), cls="batch", org_id=2, project_id=20, started=OLD, wall=8e4),
    ]
    pending = [_h100(1, 8, cls="production"), _h100(2, 4, cls="premium", wall=2_950)]
    res = schedule(snap([node(1), node(2)], pending, run, quotas=Quotas(org={(1, "H100"): 8}), now=NOW))
    assert res.preemptions == []


def test_a_quota_preemption_is_sized_at_the_claims_that_start_during_its_run() -> None:
    """(Mutant: _peak read only at the start.) Job 1 (EASY in r2 from NOW + 1,000) claims 4 of org 1's
    10. Job 2 (6, over now: 6 + 6 > 10) must fit at NOW + 1,000 too: X1 + X2 (4) + 4 + 6 > 10, so both
    2-GPU batch jobs stop, not one."""
    run = [
        running(50, ((1, (0, 1)),), cls="batch", org_id=1, project_id=10, started=OLD, wall=8e4),
        running(51, ((1, (2, 3)),), cls="batch", org_id=1, project_id=10, started=OLD, wall=8e4),
        running(52, ((1, (4, 5)),), cls="production", org_id=1, project_id=10, started=NOW - 100, wall=600,
                preemptible=False),
        running(60, ((1, (6, 7)),), cls="production", org_id=2, project_id=20, started=NOW - 100, wall=1_100,
                preemptible=False),
        running(61, ((2, tuple(range(8))),), cls="production", org_id=2, project_id=20, started=NOW - 100,
                wall=1_100, preemptible=False),
    ]
    nodes = [node(1, region="r1"), node(2, region="r2"), node(3, region="r1")]
    e = _h100(1, 4, cls="production", regions=("r2",))
    q = _h100(2, 6, cls="premium", wall=3_600)
    res = schedule(snap(nodes, [e, q], run, quotas=Quotas(org={(1, "H100"): 10}), now=NOW))
    assert res.reservations[0].job_id == 1 and res.reservations[0].kind == "backfill"
    assert sorted(p.job_id for p in res.preemptions if p.for_job_id == 2) == [50, 51]
