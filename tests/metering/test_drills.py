"""The seed's follow-up drills (shared/seeds/001), each as a test against the real services.

Rate: H100 at 3.6 credits per GPU-hour = exactly 1 micro-credit per GPU-millisecond, so usage in
GPU-ms and money in micro-credits read the same. A 2-GPU, 1-hour job holds 7,200,000.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from ledger.clock import shifted
from ledger.models import MICRO, Bucket, BucketKind, Hold, HoldState, LedgerTransaction
from ledger.services import expire_due_buckets
from ledger.verification import verify_ledger
from metering.heartbeats import HeartbeatItem
from metering.services import (
    ExitReport,
    charge_progress,
    ingest_heartbeats,
    report_exit,
    report_started,
)
from metering.sweeps import reconcile, release_stranded_holds
from scheduling.models import Job, JobAttempt, JobState, Node
from scheduling.services.lifecycle import request_stop
from scheduling.services.tick import sweep_nodes
from tests.metering.conftest import World, mark_node_alive, place_pending, shift_started

HOLD = 7_200_000  # 2 GPUs x 1 h x 3.6 credits


def journal(org: Any) -> list[tuple[str, str, list[tuple[str, int | None, int]]]]:
    return [
        (t.kind, t.key, [(p.account, p.bucket_id, p.amount) for p in t.postings.order_by("pk")])
        for t in LedgerTransaction.objects.filter(org=org).order_by("pk")
    ]


def events(org: Any, since: int = 0) -> list[tuple[str, str, int | None, str]]:
    return [
        (e.action, e.subject_id, e.amount, e.reason_code)
        for e in AuditEvent.objects.filter(org_id=org.pk, seq__gt=since).order_by("seq")
    ]


def run(world: World, submit: Callable[..., Job], *, started_ago: float) -> tuple[Job, JobAttempt]:
    mark_node_alive(world.node)
    job = submit(gpus=2)
    [attempt] = place_pending()
    report_started(node=world.node, attempt_id=attempt.pk)
    shift_started(attempt, started_ago)
    return job, attempt


# -- 1. preempted at 60% of its hold ---------------------------------------------------------


def test_drill1_preempted_at_60_percent_exact_journal_holds_audit_and_refund(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    bucket = funded(100 * MICRO)
    job, attempt = run(world, submit, started_ago=2200)  # cap 2 x 2,200 s > 60% of the hold
    used = HOLD * 60 // 100  # 4,320,000 GPU-ms = 4,320,000 micro-credits
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, used)])
    assert charge_progress(attempt=attempt).captured == used
    seq_before_stop = AuditEvent.objects.filter(org_id=world.org.pk).order_by("-seq").first().seq
    request_stop(attempt=attempt, reason="preempted", grace_seconds=30)
    result = report_exit(
        node=world.node,
        attempt_id=attempt.pk,
        report=ExitReport(seq=2, cumulative_gpu_ms=used, outcome="preempted", signal=15),
    )
    assert (result.outcome, result.job_state) == ("preempted", JobState.QUEUED)

    old = Hold.objects.get(pk=attempt.hold_id)
    job.refresh_from_db()
    new = job.current_hold
    b = bucket.pk
    assert journal(world.org) == [
        (
            "issue",
            f"issue:{bucket.reference}",
            [("issuance", None, -100 * MICRO), ("bucket_available", b, 100 * MICRO)],
        ),
        ("hold", f"hold:job:{job.pk}:submit", [("bucket_available", b, -HOLD), ("bucket_held", b, HOLD)]),
        (
            "capture",
            f"capture:{old.pk}:attempt:{attempt.pk}:progress:{used}",
            [("bucket_held", b, -used), ("consumption", None, used)],
        ),
        (
            "release",
            f"release:{old.pk}:settle",
            [("bucket_held", b, -(HOLD - used)), ("bucket_available", b, HOLD - used)],
        ),
        (
            "hold",
            f"hold:job:{job.pk}:attempt:2:hold",
            [("bucket_available", b, -HOLD), ("bucket_held", b, HOLD)],
        ),
    ]
    # Holds: the old one settled (captured 60%, refunded 40%), a fresh one for the next attempt.
    assert (old.state, old.authorized, old.captured) == (HoldState.SETTLED, HOLD, used)
    assert old.released == HOLD - used
    assert new is not None and new.pk != old.pk
    assert (new.state, new.authorized, new.captured) == (HoldState.ACTIVE, HOLD, 0)
    assert job.state == JobState.QUEUED
    # The refund: 40% of the hold, back to the exact bucket it came from.
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.spent) == (100 * MICRO - used - HOLD, HOLD, used)
    # Audit trail from the stop on, in chain order, consistent with the journal.
    assert events(world.org, since=seq_before_stop) == [
        ("sched.attempt.stop", str(attempt.pk), None, "preempted"),
        ("ledger.release", str(old.pk), HOLD - used, "release"),
        ("metering.attempt_settled", str(attempt.pk), used, "preempted"),
        ("sched.job.transition", str(job.pk), None, "preempted"),
        ("sched.job.transition", str(job.pk), None, "requeued-after-preemption"),
        ("ledger.hold", str(new.pk), HOLD, "hold"),
    ]
    settled = AuditEvent.objects.get(org_id=world.org.pk, action="metering.attempt_settled")
    assert settled.data["released"] == HOLD - used and settled.data["billable_gpu_ms"] == used
    assert verify_ledger() == []


# -- 2. the finish call is lost ----------------------------------------------------------------


def test_drill2_lost_finish_refunds_exactly_once_even_with_a_late_report(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    bucket = funded(100 * MICRO)
    job, attempt = run(world, submit, started_ago=1000)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 7, 1_500_000)])
    # The job stops and the agent dies before reporting: the node falls silent.
    Node.objects.filter(pk=world.node.pk).update(last_heartbeat_at=timezone.now() - timedelta(hours=1))
    first = sweep_nodes()
    assert first["lost"] == 1
    assert sweep_nodes()["lost"] == 0  # a second sweep (or a concurrent one) finds nothing
    assert release_stranded_holds() == {"settled": 0, "released": 0}
    old = Hold.objects.get(pk=attempt.hold_id)
    assert (old.state, old.captured, old.released) == (HoldState.SETTLED, 1_500_000, HOLD - 1_500_000)
    attempt.refresh_from_db()
    assert attempt.outcome == "lost"
    snapshot = (journal(world.org), Bucket.objects.get(pk=bucket.pk).available)

    # The agent comes back and reports late, with more usage: 200, nothing changes.
    report = ExitReport(seq=9, cumulative_gpu_ms=1_900_000, outcome="completed", exit_code=0)
    late = report_exit(node=world.node, attempt_id=attempt.pk, report=report)
    assert late.duplicate is True
    assert (journal(world.org), Bucket.objects.get(pk=bucket.pk).available) == snapshot
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.current_hold_id != old.pk  # requeued, fresh hold
    assert reconcile().clean


def test_drill2_stranded_hold_of_a_terminal_job_is_released_once(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    bucket = funded(100 * MICRO)
    job = submit(gpus=2)
    # A job that ended without its hold being released (the release was lost with a crash).
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    Hold.objects.filter(pk=job.current_hold_id).update(created_at=timezone.now() - timedelta(hours=2))
    assert reconcile().counts()["terminal_with_active_hold"] == 1
    assert release_stranded_holds() == {"settled": 0, "released": 1}
    assert release_stranded_holds() == {"settled": 0, "released": 0}
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held) == (100 * MICRO, 0)
    assert reconcile().clean


# -- 3. a promotional bucket expires mid-run ----------------------------------------------------


def test_drill3_promo_expires_mid_run_hold_keeps_working_refund_goes_to_expiry(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    promo = funded(5 * MICRO, kind=BucketKind.PROMOTIONAL, expires_at=timezone.now() + timedelta(hours=1))
    paid = funded(100 * MICRO)
    _, attempt = run(world, submit, started_ago=3000)
    lines = {ln.bucket_id: ln.authorized for ln in Hold.objects.get(pk=attempt.hold_id).lines.all()}
    assert lines == {promo.pk: 5 * MICRO, paid.pk: HOLD - 5 * MICRO}  # promo first (spend order)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, 3_000_000)])
    charge_progress(attempt=attempt)
    with shifted(timedelta(hours=2)):  # the promo bucket's expiry passes mid-run
        expire_due_buckets()
        ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 2, 4_000_000)])
        assert charge_progress(attempt=attempt).captured == 1_000_000  # in-flight hold still spends
        report_exit(
            node=world.node,
            attempt_id=attempt.pk,
            report=ExitReport(seq=3, cumulative_gpu_ms=4_000_000, outcome="completed", exit_code=0),
        )
    promo.refresh_from_db()
    paid.refresh_from_db()
    # Promo: 4 spent from the in-flight hold, the 1 released after expiry went to expiry.
    assert (promo.available, promo.held, promo.spent, promo.expired) == (0, 0, 4 * MICRO, 1 * MICRO)
    assert (paid.available, paid.held, paid.spent) == (100 * MICRO, 0, 0)
    release = LedgerTransaction.objects.get(org=world.org, kind="release")
    legs = sorted((p.account, p.bucket_id, p.amount) for p in release.postings.all())
    assert legs == sorted(
        [
            ("bucket_held", promo.pk, -1 * MICRO),
            ("expiry", None, 1 * MICRO),
            ("bucket_held", paid.pk, -(HOLD - 5 * MICRO)),
            ("bucket_available", paid.pk, HOLD - 5 * MICRO),
        ]
    )
    assert verify_ledger() == []


@pytest.mark.parametrize("state", [JobState.QUEUED, JobState.SCHEDULED, JobState.PREEMPTED])
def test_an_old_hold_of_a_waiting_job_is_not_stranded(
    world: World, funded: Any, submit: Callable[..., Job], state: str
) -> None:
    """Mutation testing round 2: a job waits in the queue for hours on its hold; the stranded-hold
    sweep must leave that hold alone (released, the job would later run unpaid)."""
    funded(100 * MICRO)
    job = submit(gpus=2)
    Job.objects.filter(pk=job.pk).update(state=state)
    Hold.objects.filter(pk=job.current_hold_id).update(created_at=timezone.now() - timedelta(hours=2))
    assert release_stranded_holds() == {"settled": 0, "released": 0}
    assert Hold.objects.get(pk=job.current_hold_id).state == HoldState.ACTIVE
    assert reconcile().counts()["terminal_with_active_hold"] == 0
