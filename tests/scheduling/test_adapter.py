"""Adapter round trip: the snapshot reflects the database; a pass writes its decisions back."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from audit.models import AuditEvent
from ledger.models import Hold
from ledger.services import place_hold
from metering.models import AttemptUsage
from scheduling.adapter.snapshot import load_snapshot
from scheduling.models import (
    Allocation,
    AttemptState,
    Job,
    JobAttempt,
    JobState,
    Node,
    NodeState,
    Quota,
    SchedulerPass,
)
from scheduling.services.tick import run_scheduling_pass
from tests.factories import OrgMembershipFactory, fund
from tests.scheduling.conftest import A100_PRICE, H100_PRICE, priority

pytestmark = pytest.mark.django_db

MICRO = 1_000_000


def hold_for(tenant: dict[str, Any], amount: int, key: str) -> Hold:
    return place_hold(org=tenant["org"], amount=amount, key=key, project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100", "A100"])


def test_snapshot_loads_what_is_in_the_db(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> None:
    org = tenant["org"]
    org.fair_share_weight = 3
    org.save()
    Quota.objects.create(org=org, gpu_type=fleet["h100"], max_gpus=4)
    runner = make_job(JobState.RUNNING, gpu_count=2)
    attempt = make_attempt(runner, AttemptState.RUNNING, started_at=timezone.now())
    for i in (0, 1):
        Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=i,
                                  allocated_at=attempt.scheduled_at)
    AttemptUsage.objects.create(attempt=attempt, org_id=org.pk, reported_gpu_ms=7_200_000,
                                billable_gpu_ms=7_200_000)
    waiting = make_job(JobState.QUEUED, gpu_count=4)
    unfunded = make_job(JobState.QUEUED, hold=False)
    make_job(JobState.QUEUED, not_before=timezone.now() + timedelta(hours=1))  # backing off
    make_job(JobState.CANCELLED)

    loaded = load_snapshot(now=timezone.now())
    snap = loaded.snapshot
    assert {t: g.price_per_gpu_hour_micro for t, g in snap.gpu_types.items()} == {
        "H100": H100_PRICE, "A100": A100_PRICE,
    }
    (node,) = snap.nodes
    assert (node.id, node.gpu_type) == (fleet["node"].pk, "H100")
    assert node.free_gpu_indices == frozenset(range(2, 8))
    (running,) = snap.running
    assert (running.id, running.attempt_id, running.allocations) == (
        runner.pk, attempt.pk, ((fleet["node"].pk, (0, 1)),),
    )
    # Queue position (submission time), not start time, decides whether a victim would requeue
    # behind its preemptor.
    assert running.submitted_at == pytest.approx(runner.submitted_at.timestamp())
    assert {p.id: p.budget_ok for p in snap.pending} == {waiting.pk: True, unfunded.pk: False}
    assert snap.usage.org[org.pk] == pytest.approx(7200, rel=0.01)  # GPU-seconds, barely decayed
    assert snap.shares.org == {org.pk: 3}
    assert snap.quotas.org == {(org.pk, "H100"): 4}
    assert {c.name for c in snap.config.priority_classes} >= {"production", "standard"}


def test_snapshot_carries_run_time_of_earlier_attempts(
    make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt],
) -> None:
    # Aging counts waiting only: the core subtracts what a job already ran before this attempt.
    start = timezone.now() - timedelta(hours=3)
    requeued = make_job(JobState.QUEUED)
    make_attempt(requeued, AttemptState.ENDED, started_at=start, ended_at=start + timedelta(hours=1))
    rerun = make_job(JobState.RUNNING)
    make_attempt(rerun, AttemptState.ENDED, started_at=start, ended_at=start + timedelta(minutes=30),
                 outcome="preempted")
    make_attempt(rerun, AttemptState.ENDED, started_at=start, ended_at=start, outcome="lost")
    never_started = start + timedelta(hours=1)
    make_attempt(rerun, AttemptState.ENDED, ended_at=never_started, outcome="preempted")
    make_attempt(rerun, AttemptState.RUNNING, started_at=timezone.now())
    fresh = make_job(JobState.QUEUED)

    snap = load_snapshot(now=timezone.now()).snapshot

    assert {p.id: p.run_seconds for p in snap.pending} == {
        requeued.pk: pytest.approx(3600), fresh.pk: 0.0,
    }
    (running,) = snap.running
    assert running.prior_run_seconds == pytest.approx(1800)  # the live attempt is not counted
    # Preempted before, it is exempt longer (`preemption_exempt_growth`); a lost node is no preemption.
    assert running.times_preempted == 2


def test_run_time_before_a_release_is_not_taken_off_the_wait_that_began_at_it(
    make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt],
) -> None:
    # Preempted after an hour's run, then held and released 2 h ago: it has waited 2 h, from the
    # release (aging_from); the hour it ran before is no waiting to take back (it aged 1 h).
    now = timezone.now()
    job = make_job(JobState.QUEUED)
    make_attempt(job, AttemptState.ENDED, started_at=now - timedelta(hours=5),
                 ended_at=now - timedelta(hours=4), outcome="preempted")
    Job.objects.filter(pk=job.pk).update(submitted_at=now - timedelta(hours=6),
                                         aging_from=now - timedelta(hours=2))
    (pending,) = load_snapshot(now=now).snapshot.pending
    assert pending.run_seconds == 0.0
    assert now.timestamp() - pending.submitted_at == pytest.approx(7200, abs=1)


def test_exempt_growth_is_an_operator_setting(settings: Any) -> None:
    assert load_snapshot(now=timezone.now()).snapshot.config.preemption_exempt_growth == 2.0  # ADR 0007
    settings.SCHEDULER_PREEMPT_EXEMPT_GROWTH = 1  # off: the plain minimum runtime every time
    assert load_snapshot(now=timezone.now()).snapshot.config.preemption_exempt_growth == 1.0
    settings.SCHEDULER_PREEMPT_EXEMPT_GROWTH = 0.5  # would undercut the minimum runtime
    with pytest.raises(ValueError, match="preemption_exempt_growth must be >= 1"):
        load_snapshot(now=timezone.now())


def test_exempt_after_is_an_operator_setting(settings: Any) -> None:
    assert load_snapshot(now=timezone.now()).snapshot.config.preemption_exempt_after == 5  # ADR 0007
    settings.SCHEDULER_PREEMPT_EXEMPT_AFTER = 0  # growth from the first preemption
    assert load_snapshot(now=timezone.now()).snapshot.config.preemption_exempt_after == 0
    settings.SCHEDULER_PREEMPT_EXEMPT_AFTER = -1
    with pytest.raises(ValueError, match="preemption_exempt_after must be an int >= 0"):
        load_snapshot(now=timezone.now())


def test_end_time_packing_is_an_operator_setting(settings: Any) -> None:
    assert load_snapshot(now=timezone.now()).snapshot.config.end_time_packing == "off"
    settings.SCHEDULER_END_TIME_PACKING = "tightest"
    assert load_snapshot(now=timezone.now()).snapshot.config.end_time_packing == "tightest"
    settings.SCHEDULER_END_TIME_PACKING = "newest"
    with pytest.raises(ValueError, match="end_time_packing must be one of off, tightest, partial"):
        load_snapshot(now=timezone.now())


def test_pass_places_a_job_and_fixes_the_rate(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    fund(tenant["org"], 100 * MICRO)
    hold = hold_for(tenant, 6 * MICRO, "h1")
    job = make_job(JobState.QUEUED, current_hold=hold, gpu_types=["H100"], gpu_count=2)

    row = run_scheduling_pass(trigger="test")

    assert row is not None and (row.pending, row.placed) == (1, 1)
    job.refresh_from_db()
    assert (job.state, job.attempt_count, job.wait_reason) == (JobState.SCHEDULED, 1, "")
    attempt = JobAttempt.objects.get(job=job)
    assert (attempt.number, attempt.rate_per_gpu_hour, attempt.hold_id) == (1, H100_PRICE, hold.pk)
    gpus = sorted(Allocation.objects.filter(attempt=attempt).values_list("node_id", "gpu_index"))
    assert len(gpus) == 2 and {n for n, _ in gpus} == {fleet["node"].pk}
    assert AttemptUsage.objects.filter(attempt=attempt).exists()
    event = AuditEvent.objects.get(action="sched.place", subject_id=str(job.pk))
    assert event.reason_code == "placed" and event.data["rate"] == H100_PRICE
    hold.refresh_from_db()
    assert hold.released == 0  # placed on the type the hold was priced for: nothing to release
    assert SchedulerPass.objects.count() == 1


def test_placement_on_a_cheaper_type_releases_the_excess(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    Node.objects.filter(pk=fleet["node"].pk).update(state=NodeState.DOWN)
    Node.objects.create(name="a100-1", region=fleet["region"], gpu_type=fleet["a100"], gpu_count=8,
                        state=NodeState.READY, last_heartbeat_at=timezone.now())
    fund(tenant["org"], 100 * MICRO)
    h100_cost = 2 * H100_PRICE  # 2 GPUs x 1 hour
    hold = hold_for(tenant, h100_cost, "h2")
    job = make_job(JobState.QUEUED, current_hold=hold, gpu_count=2, max_wall_seconds=3600)

    run_scheduling_pass(trigger="test")

    attempt = JobAttempt.objects.get(job=job)
    assert attempt.rate_per_gpu_hour == A100_PRICE
    hold.refresh_from_db()
    assert (hold.state, hold.released) == ("active", h100_cost - 2 * A100_PRICE)
    assert hold.remaining == 2 * A100_PRICE


def test_a_gpu_can_never_be_allocated_twice(
    fleet: dict[str, Any], make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt],
) -> None:
    first = make_attempt(make_job(JobState.SCHEDULED))
    second = make_attempt(make_job(JobState.SCHEDULED))
    now = timezone.now()
    Allocation.objects.create(attempt=first, node=fleet["node"], gpu_index=3, allocated_at=now)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(attempt=second, node=fleet["node"], gpu_index=3, allocated_at=now)
    # Once released, the GPU can be given again.
    Allocation.objects.filter(attempt=first).update(released_at=now)
    Allocation.objects.create(attempt=second, node=fleet["node"], gpu_index=3, allocated_at=now)
    assert Allocation.objects.filter(node=fleet["node"], gpu_index=3, released_at__isnull=True).count() == 1


def _batch_running_and_production_queued(
    fleet: dict[str, Any], make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt], gpus: int,
) -> tuple[Job, JobAttempt, Job]:
    """A batch job running for 2 h on GPUs 0..gpus-1 of the H100 node, and a production job of the
    same size queued for H100. The victim has 10 h of wall, 8 h left: more than the production
    job's 1 h, so the default gain rule allows preempting it."""
    long_ago = timezone.now() - timedelta(hours=2)
    victim = make_job(JobState.RUNNING, gpu_count=gpus, priority_class=priority("batch"),
                      max_wall_seconds=36_000)
    attempt = make_attempt(victim, AttemptState.RUNNING, started_at=long_ago, scheduled_at=long_ago)
    for i in range(gpus):
        Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=i, allocated_at=long_ago)
    urgent = make_job(JobState.QUEUED, gpu_count=gpus, gpu_types=["H100"],
                      priority_class=priority("production"), preemptible=False,
                      hold_amount=gpus * H100_PRICE)  # its hour on H100: a preemption must be paid for
    return victim, attempt, urgent


def test_preemption_requests_a_stop_with_grace(
    fleet: dict[str, Any], make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt],
    settings: Any,
) -> None:
    settings.SCHEDULER_PREEMPT_GRACE_SECONDS = 90
    victim, attempt, urgent = _batch_running_and_production_queued(fleet, make_job, make_attempt, gpus=8)

    row = run_scheduling_pass(trigger="test")

    assert row is not None and row.preempted == 1 and row.placed == 0
    attempt.refresh_from_db()
    assert (attempt.state, attempt.stop_reason, attempt.grace_seconds) == (
        AttemptState.STOPPING, "preempted", 90,
    )
    event = AuditEvent.objects.get(action="sched.preempt")
    assert event.data["for_job"] == urgent.pk and event.subject_id == str(victim.pk)
    urgent.refresh_from_db()
    assert urgent.state == JobState.QUEUED and urgent.wait_reason  # waits for the victim's exit
    # The next pass does not signal the victim again.
    assert run_scheduling_pass(trigger="test").preempted == 0  # type: ignore[union-attr]


def test_a_stopping_attempt_is_given_to_the_core_with_its_own_grace(
    fleet: dict[str, Any], make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt],
) -> None:
    """A cancellation's grace (30 s), not the preemption grace the core assumes otherwise."""
    from scheduling.adapter.snapshot import load_fleet
    from scheduling.services.lifecycle import request_stop

    victim, attempt, _urgent = _batch_running_and_production_queued(fleet, make_job, make_attempt, gpus=8)
    _nodes, running, _orgs = load_fleet(timezone.now())
    assert [(r.id, r.stop_grace_seconds) for r in running] == [(victim.pk, None)]
    request_stop(attempt=attempt, reason="cancelled", grace_seconds=30)
    _nodes, running, _orgs = load_fleet(timezone.now())
    assert [(r.id, r.stop_grace_seconds) for r in running] == [(victim.pk, 30.0)]
    assert running[0].preemption_requested_at is not None


def test_a_job_at_its_quota_preempts_its_own_orgs_lower_class_job(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> None:
    Quota.objects.create(org=tenant["org"], gpu_type=fleet["h100"], max_gpus=4)
    # Four H100s stay free, but the org's quota of 4 is used by its own batch job.
    victim, _, urgent = _batch_running_and_production_queued(fleet, make_job, make_attempt, gpus=4)

    row = run_scheduling_pass(trigger="test")

    assert row is not None and (row.preempted, row.placed) == (1, 0)
    event = AuditEvent.objects.get(action="sched.preempt")
    assert (event.reason_code, event.subject_id, event.data["for_job"]) == (
        "preempted-for-quota", str(victim.pk), urgent.pk,
    )
    urgent.refresh_from_db()
    assert (urgent.wait_reason, urgent.wait_detail) == (
        "waiting-for-preemption", f"on H100: waiting for job {victim.pk} to exit (own quota)",
    )


def test_wait_reasons_are_kept_and_audited_only_on_change(
    fleet: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    too_big = make_job(JobState.QUEUED, gpu_count=16, gpu_types=["H100"])
    unfunded = make_job(JobState.QUEUED, hold=False)

    run_scheduling_pass(trigger="test")
    run_scheduling_pass(trigger="test")

    too_big.refresh_from_db()
    unfunded.refresh_from_db()
    assert too_big.wait_reason in {"resources", "no-matching-gpu-type"}
    assert unfunded.wait_reason == "budget"
    assert AuditEvent.objects.filter(action="sched.skip").count() == 2
    assert SchedulerPass.objects.order_by("pk").last().waiting_changed == 0  # type: ignore[union-attr]
    call_command("verify_audit")  # the batch-appended events chain like single ones


def test_a_job_waiting_for_its_quota_is_not_overtaken_by_a_later_job_of_its_org(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> None:
    """The QA finding: a production job held back by its org's quota watched later batch jobs of
    the org that fit under the quota take every GPU the quota freed. Now the quota is reserved for
    it from when the running job reaches its max wall, and the later job says whom it waits for."""
    Quota.objects.create(org=tenant["org"], gpu_type=fleet["h100"], max_gpus=8)
    started = timezone.now() - timedelta(minutes=10)
    running = make_job(JobState.RUNNING, gpu_count=4, priority_class=priority("batch"), preemptible=False)
    attempt = make_attempt(running, AttemptState.RUNNING, started_at=started, scheduled_at=started)
    for i in range(4):
        Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=i, allocated_at=started)
    urgent = make_job(JobState.QUEUED, gpu_count=8, gpu_types=["H100"], priority_class=priority("production"))
    later = make_job(JobState.QUEUED, gpu_count=4, gpu_types=["H100"], priority_class=priority("batch"),
                     max_wall_seconds=86_400)

    row = run_scheduling_pass(trigger="test")

    assert row is not None and row.placed == 0
    urgent.refresh_from_db()
    later.refresh_from_db()
    assert urgent.wait_reason == "quota"
    assert "; quota reserved for it from " in urgent.wait_detail and urgent.wait_detail.endswith(" on H100")
    # Its quota room comes when the running job reaches its max wall: its expected start.
    ahead = (urgent.expected_start_at - (started + timedelta(hours=1))).total_seconds()
    assert 0 <= ahead < 1 and urgent.expected_start_at.microsecond == 0  # rounded up to the second
    assert later.expected_start_at is None
    assert (later.wait_reason, later.wait_detail) == (
        f"reserved-for-job-{urgent.pk}",
        f"fits under its org's concurrent-GPU quota on H100 only by delaying job {urgent.pk}",
    )
    assert AuditEvent.objects.filter(action="sched.skip", subject_id=str(later.pk),
                                     reason_code=f"reserved-for-job-{urgent.pk}").exists()


def test_a_blocked_job_shows_when_its_reservation_expects_it_to_start(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> None:
    """Slurm's `squeue --start`: the EASY reservation's start (the running job's max wall) is the
    blocked job's `expected_start_at`, in the API; a hold or a placement clears it."""
    from rest_framework.test import APIClient

    from scheduling.services.holding import hold_job, release_job

    started = timezone.now() - timedelta(minutes=10)
    running = make_job(JobState.RUNNING, gpu_count=4, priority_class=priority("production"),
                       preemptible=False)
    attempt = make_attempt(running, AttemptState.RUNNING, started_at=started, scheduled_at=started)
    for i in range(4):
        Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=i, allocated_at=started)
    big = make_job(JobState.QUEUED, gpu_count=8, gpu_types=["H100"])
    small = make_job(JobState.QUEUED, gpu_count=8, gpu_types=["H100"], submitted_at=timezone.now())
    OrgMembershipFactory(org=tenant["org"], user=tenant["user"])
    api = APIClient()
    api.force_authenticate(tenant["user"])

    run_scheduling_pass(trigger="test")
    big.refresh_from_db()
    expected = started + timedelta(seconds=3600)
    assert big.expected_start_at is not None
    assert 0 <= (big.expected_start_at - expected).total_seconds() < 1  # rounded up to the second
    shown = api.get(f"/api/v1/jobs/{big.pk}").json()["expected_start_at"]
    assert shown is not None and 0 <= (parse_datetime(shown) - expected).total_seconds() < 1
    assert api.get(f"/api/v1/jobs/{small.pk}").json()["expected_start_at"] is None  # no reservation
    run_scheduling_pass(trigger="test")  # the same reservation: nothing to rewrite
    assert SchedulerPass.objects.order_by("pk").last().waiting_changed == 0  # type: ignore[union-attr]

    hold_job(job=big, actor=tenant["user"])
    assert Job.objects.get(pk=big.pk).expected_start_at is None
    release_job(job=big, actor=tenant["user"])
    run_scheduling_pass(trigger="test")
    assert Job.objects.get(pk=big.pk).expected_start_at is not None

    # The running job ends (and the other waiting job is gone): the blocked one is placed and
    # expects nothing any more.
    Job.objects.filter(pk=small.pk).update(state=JobState.CANCELLED)
    fund(tenant["org"], 10**12)  # the test hold was priced below H100: the placement tops it up
    Allocation.objects.filter(attempt=attempt).update(released_at=timezone.now())
    JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.ENDED, ended_at=timezone.now())
    Job.objects.filter(pk=running.pk).update(state=JobState.COMPLETED)
    run_scheduling_pass(trigger="test")
    big.refresh_from_db()
    assert big.state == JobState.SCHEDULED and big.expected_start_at is None
    assert api.get(f"/api/v1/jobs/{big.pk}").json()["expected_start_at"] is None


def test_a_node_before_its_maintenance_window_takes_only_jobs_that_end_by_then(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    node = fleet["node"]
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(maintenance_from=now + timedelta(hours=2),
                                           maintenance_until=now + timedelta(hours=5))
    fund(tenant["org"], 10**12)
    long = make_job(JobState.QUEUED, gpu_count=4, gpu_types=["H100"], max_wall_seconds=3 * 3600)
    short = make_job(JobState.QUEUED, gpu_count=4, gpu_types=["H100"], max_wall_seconds=3600)
    (pending_node,) = load_snapshot(now=now).snapshot.nodes
    assert pending_node.state == "ready" and pending_node.available_until == pytest.approx(
        (now + timedelta(hours=2)).timestamp(), abs=1e-3)
    assert pending_node.maintenance_ends == pytest.approx((now + timedelta(hours=5)).timestamp(), abs=1e-3)

    run_scheduling_pass(trigger="test")
    assert Job.objects.get(pk=short.pk).state == JobState.SCHEDULED
    waiting = Job.objects.get(pk=long.pk)
    assert waiting.state == JobState.QUEUED and waiting.wait_reason == "resources"

    # Inside the window the node takes nothing new, as if drained; after it, it is a node again.
    inside = load_snapshot(now=now + timedelta(hours=3)).snapshot.nodes[0]
    assert inside.state == "draining"
    assert inside.maintenance_ends == pytest.approx((now + timedelta(hours=5)).timestamp(), abs=1e-3)
    after = load_snapshot(now=now + timedelta(hours=6)).snapshot.nodes[0]
    assert (after.state, after.available_until, after.maintenance_ends) == ("ready", None, None)
    # Drained by an operator as well: the window's end is no promise of its return.
    Node.objects.filter(pk=node.pk).update(cordon="drain")
    assert load_snapshot(now=now + timedelta(hours=3)).snapshot.nodes[0].maintenance_ends is None


def test_a_job_only_a_node_in_maintenance_can_hold_expects_to_start_when_the_window_ends(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    """The only H100 node is inside its maintenance window: the 8-GPU job's `expected_start_at`
    (in the API too) is the window's end, rounded up to the second, and nothing is placed."""
    from rest_framework.test import APIClient

    now = timezone.now()
    until = now + timedelta(hours=2)
    Node.objects.filter(pk=fleet["node"].pk).update(maintenance_from=now - timedelta(hours=1),
                                                    maintenance_until=until)
    fund(tenant["org"], 10**12)
    big = make_job(JobState.QUEUED, gpu_count=8, gpu_types=["H100"])
    OrgMembershipFactory(org=tenant["org"], user=tenant["user"])
    api = APIClient()
    api.force_authenticate(tenant["user"])

    run_scheduling_pass(trigger="test")
    big.refresh_from_db()
    assert big.state == JobState.QUEUED and big.wait_reason == "resources"
    assert big.wait_detail.endswith(" on H100, on GPUs back from maintenance by then"), big.wait_detail
    assert big.expected_start_at is not None
    assert 0 <= (big.expected_start_at - until).total_seconds() < 1
    shown = api.get(f"/api/v1/jobs/{big.pk}").json()["expected_start_at"]
    assert shown is not None and 0 <= (parse_datetime(shown) - until).total_seconds() < 1

    # Drained by an operator as well, the window's end is no promise: no expected start.
    Node.objects.filter(pk=fleet["node"].pk).update(cordon="drain")
    run_scheduling_pass(trigger="test")
    assert Job.objects.get(pk=big.pk).expected_start_at is None


def test_usage_decays_by_half_each_half_life(
    tenant: dict[str, Any], make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt],
) -> None:
    """Mutation testing round 2: usage one half-life old counts half, two half-lives a quarter."""
    from datetime import UTC, datetime

    from scheduling.adapter.snapshot import load_usage

    now = datetime(2026, 11, 1, 12, 30, tzinfo=UTC)  # the middle of an hour: ages are exact
    org = tenant["org"]
    for hours_ago in (2, 4):
        job = make_job(JobState.COMPLETED)
        ended = now - timedelta(hours=hours_ago)
        attempt = make_attempt(job, AttemptState.ENDED, started_at=ended - timedelta(minutes=10),
                               ended_at=ended)
        AttemptUsage.objects.create(attempt=attempt, org_id=org.pk, reported_gpu_ms=3_600_000,
                                    billable_gpu_ms=3_600_000)
    usage = load_usage(now, half_life=7200.0)
    assert usage.org[org.pk] == pytest.approx(3600 * 0.5 + 3600 * 0.25)
    assert usage.project[tenant["project"].pk] == pytest.approx(2700)
    assert load_usage(now, half_life=14_400.0).org[org.pk] == pytest.approx(3600 * 0.5 ** 0.5 + 3600 * 0.5)
