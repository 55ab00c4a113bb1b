"""Quota reservations: a job its concurrent-GPU quota holds back is not overtaken for ever by later
jobs of its org or project that fit under the quota (the quota side of EASY backfill)."""

from __future__ import annotations

from scheduling.core import Quotas, Reservation, RunningJob, schedule
from scheduling.core import reasons as R
from tests.scheduling.core.helpers import job, node, running, snap

NOW = 10_000.0
END = NOW + 3_000  # when org 1's running batch job reaches its max wall


def _org1_at_quota() -> tuple[list, list, Quotas]:
    """Org 1 (cap 8 H100) runs a 4-GPU batch job until END; node 2 is idle."""
    run = [
        running(50, ((1, (0, 1, 2, 3)),), cls="batch", org_id=1, project_id=10, started=NOW - 600, wall=3_600)
    ]
    return [node(1), node(2)], run, Quotas(org={(1, "H100"): 8})


def _h100(jid: int, gpus: int, cls: str = "batch", wall: float = 86_400.0, **kw: object):
    return job(jid, gpus=gpus, gpu_types=("H100",), cls=cls, submitted=NOW - 100 + jid, wall=wall, **kw)


def test_a_later_lower_class_job_of_the_org_no_longer_takes_the_quota_a_production_job_waits_for() -> None:
    nodes, run, quotas = _org1_at_quota()
    head = _h100(1, gpus=8, cls="production")
    later = _h100(2, gpus=4)  # fits under the quota now (4 + 4 <= 8), runs past END
    res = schedule(snap(nodes, [head, later], run, quotas=quotas, now=NOW))
    assert res.placements == []
    assert res.wait_reasons[1] == R.QUOTA
    assert res.skips[0].detail == (
        "concurrent-GPU quota: H100 org 4 of 8 in use; needs 8; "
        f"quota reserved for it from {R.utc_time(END)} on H100"
    )
    assert res.wait_reasons[2] == R.reserved_for(1)
    assert res.skips[1].detail == "fits under its org's concurrent-GPU quota on H100 only by delaying job 1"
    [reservation] = res.reservations
    assert (reservation.job_id, reservation.kind, reservation.start_at, reservation.allocations) == (
        1, "quota", END, ()
    )
    # When job 50 is gone the production job starts, and the batch job waits for its quota.
    res = schedule(snap(nodes, [head, later], [], quotas=quotas, now=END))
    assert [p.job_id for p in res.placements] == [1] and res.wait_reasons[2] == R.QUOTA


def test_a_later_job_that_ends_before_the_reservation_backfills_under_the_quota() -> None:
    nodes, run, quotas = _org1_at_quota()
    short = _h100(2, gpus=4, wall=END - NOW)  # ends exactly when the quota is due to the head job
    res = schedule(snap(nodes, [_h100(1, gpus=8, cls="production"), short], run, quotas=quotas, now=NOW))
    # It went ahead of job 1 under the quota: a backfill, as ahead of an EASY reservation.
    assert [(p.job_id, p.reason_code, p.backfilled) for p in res.placements] == [(2, R.BACKFILLED, True)]
    too_long = _h100(2, gpus=4, wall=END - NOW + 1)
    res = schedule(snap(nodes, [_h100(1, gpus=8, cls="production"), too_long], run, quotas=quotas, now=NOW))
    assert res.placements == [] and res.wait_reasons[2] == R.reserved_for(1)


def test_other_tenants_and_other_types_are_not_held_back() -> None:
    nodes, run, quotas = _org1_at_quota()
    nodes.append(node(3, "A100"))
    pending = [
        _h100(1, gpus=8, cls="production"),
        _h100(2, gpus=4, org_id=2, project_id=20),  # another org: its own (unlimited) quota
        job(3, gpus=4, gpu_types=("A100",), cls="batch", submitted=NOW, org_id=1),  # org 1, another type
    ]
    res = schedule(snap(nodes, pending, run, quotas=quotas, now=NOW))
    assert sorted(p.job_id for p in res.placements) == [2, 3]


def test_a_project_quota_reservation_holds_back_only_that_project() -> None:
    run = [
        running(50, ((1, (0, 1)),), org_id=1, project_id=10, started=NOW - 600, wall=3_600),  # until END
        running(51, ((1, (2, 3)),), org_id=1, project_id=10, started=NOW - 600, wall=86_400),
    ]
    quotas = Quotas(project={(10, "H100"): 6})
    pending = [
        _h100(1, gpus=4, cls="premium"),  # 4 + 4 > 6: its room from END, when job 50 ends
        _h100(2, gpus=2),  # same project: 4 + 2 fits the quota now, but at END 2 + 4 + 2 > 6
        _h100(3, gpus=2, project_id=11),  # same org, another project
    ]
    res = schedule(snap([node(1), node(2)], pending, run, quotas=quotas, now=NOW))
    assert [p.job_id for p in res.placements] == [3]
    assert res.wait_reasons[1] == R.QUOTA and res.wait_reasons[2] == R.reserved_for(1)
    assert "project's concurrent-GPU quota" in res.skips[1].detail
    # With job 51 gone by END too, 0 + 4 + 2 <= 6 then: job 2 fits beside job 1 and starts
    # (QA: it waited for nothing, judged by what runs now).
    shorter = [run[0], running(51, ((1, (2, 3)),), org_id=1, project_id=10, started=NOW - 600, wall=3_600)]
    res = schedule(snap([node(1), node(2)], pending, shorter, quotas=quotas, now=NOW))
    assert sorted(p.job_id for p in res.placements) == [2, 3]
    assert res.wait_reasons[1] == R.QUOTA


def test_an_easy_reservation_also_keeps_its_quota_room() -> None:
    """A job waiting for GPUs (EASY reservation) is not left without quota when its GPUs free up:
    a later job of its org may start beside it only if both fit under the quota."""
    other = running(60, ((1, tuple(range(8))),), org_id=2, project_id=20, started=NOW - 600, wall=3_600)
    nodes = [node(1), node(2, gpus=4)]
    quotas = Quotas(org={(1, "H100"): 8})
    head = _h100(1, gpus=8, cls="standard")  # needs node 1, busy until END
    beside = _h100(2, gpus=4)  # fits node 2, GPU-wise beside the reservation, but 4 + 8 > 8
    res = schedule(snap(nodes, [head, beside], [other], quotas=quotas, now=NOW))
    assert res.reservation is not None and res.reservation.job_id == 1 and res.reservation.start_at == END
    assert res.placements == [] and res.wait_reasons[2] == R.reserved_for(1)
    assert res.skips[1].detail == "fits under its org's concurrent-GPU quota on H100 only by delaying job 1"
    # With room for both under the quota, it starts.
    roomy = Quotas(org={(1, "H100"): 12})
    res = schedule(snap(nodes, [head, beside], [other], quotas=roomy, now=NOW))
    assert [p.job_id for p in res.placements] == [2]


def test_one_quota_reservation_per_scope_and_none_that_could_never_start() -> None:
    nodes, run, quotas = _org1_at_quota()
    pending = [_h100(1, gpus=8, cls="production"), _h100(2, gpus=8, cls="production"), _h100(3, gpus=2)]
    res = schedule(snap(nodes, pending, run, quotas=quotas, now=NOW))
    assert [r.job_id for r in res.reservations] == [1]
    # Job 2 is over the quota whatever job 1 does; it waits without a reservation of its own.
    assert res.wait_reasons[2] == R.QUOTA and "reserved" not in res.skips[1].detail
    assert res.wait_reasons[3] == R.reserved_for(1)
    # A gang larger than the quota could never start under it: no reservation, nothing held back.
    # (Submission refuses such jobs; a quota lowered later leaves them queued.)
    big = _h100(1, gpus=12, cls="production")
    res = schedule(snap(nodes, [big, _h100(3, gpus=2)], run, quotas=quotas, now=NOW))
    assert res.reservations == [] and [p.job_id for p in res.placements] == [3]


def test_quota_preemptions_count_the_room_already_promised_and_the_jobs_already_leaving() -> None:
    """Two production jobs at their org's quota: the second sizes its preemption beside the first's
    claim, counting the first's victim as gone, so both fit once their victims exit."""

    def batch(jid: int, idx: tuple[int, ...]) -> RunningJob:
        return running(jid, ((1, idx),), cls="batch", org_id=1, project_id=10, started=NOW - 7_200, wall=8e4)

    run = [batch(50, (0, 1, 2, 3)), batch(52, (4, 5)), batch(53, (6, 7))]
    quotas = Quotas(org={(1, "H100"): 8})
    pending = [_h100(1, gpus=4, cls="production", wall=3_600), _h100(2, gpus=4, cls="production", wall=3_600)]
    res = schedule(snap([node(1), node(2)], pending, run, quotas=quotas, now=NOW))
    by_job = {p.for_job_id: set() for p in res.preemptions}
    for p in res.preemptions:
        by_job[p.for_job_id].add(p.job_id)
    assert by_job == {1: {50}, 2: {52, 53}}
    assert res.wait_reasons[1] == res.wait_reasons[2] == R.WAITING_FOR_PREEMPTION
    # A third one finds nothing left to stop and the room promised to both: it waits for its quota.
    third = _h100(3, gpus=4, cls="production", wall=3_600)
    res = schedule(snap([node(1), node(2)], [*pending, third], run, quotas=quotas, now=NOW))
    assert res.wait_reasons[3] == R.QUOTA and "reserved" not in res.skips[-1].detail


# -- found in review: claims of other kinds or levels, claim-blocked jobs, reserved windows -------

def _two_nodes_busy() -> list:
    """Node 1: org 1 / project 10 runs 4 GPUs until END; node 2: another org, busy until NOW + 1,000."""
    return [
        running(50, ((1, (0, 1, 2, 3)),), org_id=1, project_id=10, started=NOW - 600, wall=3_600),
        running(60, ((2, tuple(range(8))),), org_id=2, project_id=20, started=NOW - 600, wall=1_600),
    ]


def test_an_easy_claim_on_the_org_does_not_cost_a_project_its_quota_reservation() -> None:
    quotas = Quotas(org={(1, "H100"): 100}, project={(10, "H100"): 8})
    gpu_blocked = _h100(1, gpus=8, cls="production", project_id=11)  # EASY on node 2: claims org 1 room
    held = _h100(2, gpus=8, cls="premium")  # project 10: 4 + 8 > 8
    later = _h100(3, gpus=4)  # project 10: 4 + 4 <= 8, would take the room job 2 waits for
    pending = [gpu_blocked, held, later]
    res = schedule(snap([node(1), node(2)], pending, _two_nodes_busy(), quotas=quotas, now=NOW))
    assert [(r.job_id, r.kind) for r in res.reservations] == [(1, "backfill"), (2, "quota")]
    assert res.placements == [] and res.wait_reasons[3] == R.reserved_for(2)


def test_an_easy_claim_in_the_same_project_does_not_cost_it_its_quota_reservation() -> None:
    nodes = [node(1, region="r1"), node(2, region="r2")]
    quotas = Quotas(project={(10, "H100"): 10})
    small = _h100(1, gpus=2, cls="production", regions=("r2",))  # EASY in r2 from NOW + 1,000: claims 2
    held = _h100(2, gpus=8, cls="premium")  # 4 + 8 > 10
    later = _h100(3, gpus=2)  # 4 + 2 + 2 <= 10 beside job 1's claim, but would delay job 2
    res = schedule(snap(nodes, [small, held, later], _two_nodes_busy(), quotas=quotas, now=NOW))
    assert [(r.job_id, r.kind) for r in res.reservations] == [(1, "backfill"), (2, "quota")]
    assert res.placements == [] and res.wait_reasons[3] == R.reserved_for(2)


def test_a_job_held_back_by_a_claim_gets_its_own_quota_room() -> None:
    """A premium job under its quota but for an EASY claim waits behind that claim; a later batch
    job that fits beside the claim must not take the room the premium job needs after it."""
    quotas = Quotas(project={(10, "H100"): 16})
    gpu_blocked = _h100(1, gpus=8, cls="production")  # EASY on node 2 from NOW + 1,000: claims 8
    held = _h100(2, gpus=8, cls="premium")  # 4 + 8 <= 16, + job 1's claim > 16
    later = _h100(3, gpus=4)  # 4 + 4 + 8 <= 16 beside job 1, but then job 2 waits for it too
    pending = [gpu_blocked, held, later]
    res = schedule(snap([node(1), node(2)], pending, _two_nodes_busy(), quotas=quotas, now=NOW))
    assert res.wait_reasons[2] == R.reserved_for(1)
    assert f"; quota reserved for it from {R.utc_time(END)} on H100" in res.skips[1].detail
    assert res.placements == [] and res.wait_reasons[3] == R.reserved_for(2)


def test_an_easy_reservation_is_quota_checked_over_the_run_it_reserves() -> None:
    """Job 2 would end before job 1's quota claim if it started now, but its GPUs free only at
    NOW + 1,500: reserved from then, its run would cross the claim. It gets no reservation."""
    run = [
        running(50, ((1, (0, 1, 2, 3)),), org_id=1, project_id=10, started=NOW - 600, wall=3_600),
        running(60, ((2, tuple(range(8))),), org_id=2, project_id=20, started=NOW - 600, wall=2_100),
    ]
    nodes = [node(1, region="r1"), node(2, region="r2")]
    quotas = Quotas(org={(1, "H100"): 8})
    head = _h100(1, gpus=8, cls="production")  # quota claim of 8 from END
    crossing = _h100(2, gpus=4, cls="premium", wall=2_000, regions=("r2",))
    res = schedule(snap(nodes, [head, crossing], run, quotas=quotas, now=NOW))
    assert [(r.job_id, r.kind, r.start_at) for r in res.reservations] == [(1, "quota", END)]
    assert res.wait_reasons[2] == R.RESOURCES
    assert res.skips[1].detail == (
        f"no free gang of GPUs; reserving GPUs from {R.utc_time(NOW + 1_500)} on H100 would take org quota "
        "room promised to job 1"
    )


def test_a_quota_preemption_counts_room_that_frees_before_a_claim_starts() -> None:
    """Job 1 has its quota reserved from when production job 51 ends (soon). Job 2, over the
    quota, needs to stop only batch job 50: 51's end funds job 1's claim, so counting the claim on
    top of what runs now would ask for 8 GPUs and stop nothing."""
    run = [
        running(50, ((1, (0, 1, 2, 3)),), cls="batch", org_id=1, project_id=10, started=NOW - 7_200,
                wall=8e4),
        running(51, ((1, (4, 5, 6, 7)),), cls="production", org_id=1, project_id=10, started=NOW - 3_300,
                wall=3_600, preemptible=False),  # ends at NOW + 300
    ]
    quotas = Quotas(org={(1, "H100"): 8})
    head = _h100(1, gpus=4, cls="production", wall=86_400)  # too long to preempt job 50 (gain rule)
    second = _h100(2, gpus=4, cls="premium", wall=3_600)
    res = schedule(snap([node(1), node(2)], [head, second], run, quotas=quotas, now=NOW))
    assert res.reservations[0] == Reservation(1, "H100", NOW + 300, (), "quota")
    assert [(p.job_id, p.for_job_id) for p in res.preemptions] == [(50, 2)]


def test_a_quota_preemption_counts_jobs_another_tenant_stops_only_once_they_have_gone() -> None:
    """Org 1's batch job 51 is stopped in this pass for another org's production job; it leaves
    only after its grace. Job 2 (org 1) cannot stop it again, and its quota room is not there
    before then: no reservation of it may start earlier."""
    old = NOW - 7_200
    v1 = running(51, ((1, (0, 1, 2, 3)),), cls="batch", org_id=1, project_id=10, started=old, wall=8e4)
    other = running(52, ((1, (4, 5, 6, 7)),), cls="production", org_id=3, project_id=30, started=old,
                    wall=8e4, preemptible=False)
    v2 = running(53, ((2, (0, 1, 2, 3)),), cls="batch", org_id=1, project_id=10, started=old, wall=8e4,
                 preemption_requested_at=NOW - 100)  # exits at NOW + 20
    nodes = [node(1, region="r1"), node(2, region="r2")]
    quotas = Quotas(org={(1, "H100"): 8})
    stopper = _h100(1, gpus=4, cls="production", org_id=2, project_id=20, regions=("r1",), wall=3_600)
    over = _h100(2, gpus=8, cls="production", wall=3_600)  # org 1: 8 + 8 > 8
    res = schedule(snap(nodes, [stopper, over], [v1, other, v2], quotas=quotas, now=NOW))
    assert [(p.job_id, p.for_job_id) for p in res.preemptions] == [(51, 1)]
    grace = res.preemptions[0].grace_seconds
    assert all(r.start_at >= NOW + grace for r in res.reservations if r.job_id == 2)


def test_no_quota_preemption_when_a_job_reaching_its_wall_makes_the_room_first() -> None:
    """QA: job 50 ends 5 s from now, sooner than a victim's grace; stopping batch job 51 for the
    premium job's room was needless. It waits with its quota room reserved from job 50's end."""
    run = [
        running(50, ((1, (0, 1, 2, 3)),), cls="standard", org_id=1, project_id=10, started=NOW - 3_595,
                wall=3_600, preemptible=False),
        running(51, ((1, (4, 5)),), cls="batch", org_id=1, project_id=10, started=NOW - 600, wall=86_400),
    ]
    quotas = Quotas(org={(1, "H100"): 8})
    res = schedule(snap([node(1), node(2)], [_h100(1, gpus=4, cls="premium", wall=3_600)], run,
                        quotas=quotas, now=NOW))
    assert res.preemptions == [] and res.wait_reasons[1] == R.QUOTA
    assert res.reservations == [Reservation(1, "H100", NOW + 5, (), "quota")]


def test_a_quota_lowered_below_the_job_says_it_must_be_raised() -> None:
    nodes, run, _ = _org1_at_quota()
    res = schedule(snap(nodes, [_h100(1, gpus=8)], run, quotas=Quotas(org={(1, "H100"): 6}), now=NOW))
    assert res.wait_reasons[1] == R.QUOTA and res.reservations == []
    assert res.skips[0].detail == (
        "concurrent-GPU quota: H100 org 4 of 6 in use (a quota smaller than the job: it starts there only "
        "once the quota is raised); needs 8"
    )


def test_no_quota_room_is_reserved_on_a_type_the_gang_can_never_run_on() -> None:
    # Org 1 is at its quota on both types; its A100 room frees first, but the job's regions have
    # no A100 node: the reservation is on H100, where it can run, and A100 work of the org goes on.
    nodes = [node(1, region="us"), node(2, region="us"),
             node(3, "A100", region="eu"), node(4, "A100", region="eu")]
    run = [
        running(50, ((1, (0, 1, 2, 3)),), org_id=1, project_id=10, started=NOW - 600, wall=3_600),  # to END
        running(51, ((3, (0, 1, 2, 3)),), gpu_type="A100", org_id=1, project_id=10, started=NOW - 600,
                wall=1_600),  # to END - 2,000
    ]
    quotas = Quotas(org={(1, "H100"): 8, (1, "A100"): 8})
    head = job(1, gpus=8, gpu_types=("A100", "H100"), regions=("us",), cls="production", submitted=NOW - 99)
    a100 = job(2, gpus=4, gpu_types=("A100",), cls="batch", submitted=NOW - 98, wall=86_400)
    res = schedule(snap(nodes, [head, a100], run, quotas=quotas, now=NOW))
    [reservation] = res.reservations
    assert (reservation.job_id, reservation.kind, reservation.gpu_type, reservation.start_at) == (
        1, "quota", "H100", END
    )
    assert [p.job_id for p in res.placements] == [2]


def test_a_project_quota_below_the_job_is_named_even_while_the_org_quota_binds() -> None:
    """QA: the detail named the org quota (2 of 4 in use), as if the job would start once the org
    had room; its project's quota (2) is below the job (3) and must be raised first."""
    run = [running(50, ((1, (0, 1)),), org_id=1, project_id=10, started=NOW, wall=3_600)]
    quotas = Quotas(org={(1, "H100"): 4}, project={(10, "H100"): 2})
    res = schedule(snap([node(1)], [_h100(1, gpus=3)], run, quotas=quotas, now=NOW))
    assert res.wait_reasons[1] == R.QUOTA
    assert res.skips[0].detail.startswith(
        "concurrent-GPU quota: H100 project 2 of 2 in use (a quota smaller than the job: it starts there "
        "only once the quota is raised); needs 3"
    )
