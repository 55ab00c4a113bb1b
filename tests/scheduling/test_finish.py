"""Ending attempts: settlement, permanent vs transient outcomes, retries with backoff, cancel on exit."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from ledger.models import Hold, HoldState
from ledger.services import place_hold
from scheduling.core.reasons import is_wait_reason
from scheduling.models import Allocation, AttemptState, Job, JobAttempt, JobState
from scheduling.services.lifecycle import cancel_job, finish_attempt, request_stop
from tests.factories import fund

pytestmark = pytest.mark.django_db

HOLD = 6_000_000


@pytest.fixture
def running(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> Callable[..., tuple[Job, JobAttempt]]:
    fund(tenant["org"], 500_000_000)
    counter = iter(range(1000))

    def make(**kw: Any) -> tuple[Job, JobAttempt]:
        hold = place_hold(org=tenant["org"], amount=HOLD, key=f"run-{next(counter)}",
                          project=tenant["project"], user=tenant["user"], gpu_types=["H100"])
        job = make_job(JobState.RUNNING, current_hold=hold, gpu_types=["H100"], gpu_count=1, **kw)
        attempt = make_attempt(job, AttemptState.RUNNING, gpu_count=1)
        Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=job.pk % 8,
                                  allocated_at=attempt.scheduled_at)
        return job, attempt

    return make


def relaunch(job: Job, make_attempt: Callable[..., JobAttempt], fleet: dict[str, Any]) -> JobAttempt:
    """What a pass does for a requeued job (without running the core)."""
    job.refresh_from_db()
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING)
    attempt = make_attempt(job, AttemptState.RUNNING, gpu_count=1)
    Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=job.pk % 8,
                              allocated_at=attempt.scheduled_at)
    return attempt


def test_completed_exit_ends_the_job_and_settles(running: Callable[..., tuple[Job, JobAttempt]]) -> None:
    _job, attempt = running()
    result = finish_attempt(attempt=attempt, outcome="completed", exit_code=0)
    assert result.state == JobState.COMPLETED and result.finished_at is not None
    attempt.refresh_from_db()
    assert (attempt.state, attempt.outcome, attempt.exit_code) == (AttemptState.ENDED, "completed", 0)
    assert not Allocation.objects.filter(attempt=attempt, released_at__isnull=True).exists()
    assert Hold.objects.get(pk=attempt.hold_id).state == HoldState.SETTLED
    # A duplicate exit report changes nothing.
    assert finish_attempt(attempt=attempt, outcome="failed", exit_code=1).state == JobState.COMPLETED


@pytest.mark.parametrize(("outcome", "state"), [
    ("failed", JobState.FAILED), ("launch_failed", JobState.FAILED), ("timed_out", JobState.TIMED_OUT),
])
def test_permanent_outcomes_are_not_retried(
    running: Callable[..., tuple[Job, JobAttempt]], outcome: str, state: str
) -> None:
    job, attempt = running()
    result = finish_attempt(attempt=attempt, outcome=outcome, exit_code=3)
    assert (result.state, result.end_reason) == (state, outcome)
    assert JobAttempt.objects.filter(job=job).count() == 1


def test_lost_node_requeues_with_backoff_and_a_fresh_hold_until_retries_run_out(
    running: Callable[..., tuple[Job, JobAttempt]], make_attempt: Callable[..., JobAttempt],
    fleet: dict[str, Any], settings: Any,
) -> None:
    settings.SCHEDULER_RETRY_BACKOFF_SECONDS = 10
    job, attempt = running(max_retries=2)
    holds = {attempt.hold_id}
    delays = []
    for _ in range(2):
        requeued = finish_attempt(attempt=attempt, outcome="lost")
        stored = Job.objects.get(pk=job.pk)
        assert stored.state == JobState.QUEUED and stored.wait_reason == "backoff"
        assert is_wait_reason(stored.wait_reason)  # a documented code of the API contract
        # The detail names the retry time in ISO 8601 UTC, rounded up to the second.
        shown = datetime.strptime(stored.wait_detail, "retry not before %Y-%m-%dT%H:%M:%SZ")
        assert 0 <= (shown.replace(tzinfo=UTC) - stored.not_before).total_seconds() < 1
        delays.append((stored.not_before - Hold.objects.get(pk=attempt.hold_id).settled_at).total_seconds())
        assert stored.current_hold_id not in holds and requeued.current_hold.state == HoldState.ACTIVE
        holds.add(stored.current_hold_id)
        attempt = relaunch(job, make_attempt, fleet)
    assert [round(d) for d in delays] == [10, 20]
    final = finish_attempt(attempt=attempt, outcome="lost")
    assert (final.state, final.end_reason) == (JobState.FAILED, "retries-exhausted")
    assert final.end_detail == "its node was lost 3 times (attempts ending lost); max_retries is 2"


def test_preemption_requeues_at_once_without_using_a_retry(
    running: Callable[..., tuple[Job, JobAttempt]],
) -> None:
    job, attempt = running(max_retries=0)
    request_stop(attempt=attempt, reason="preempted", grace_seconds=60)
    result = finish_attempt(attempt=attempt, outcome="failed", exit_code=143)  # SIGTERM exit
    assert result.state == JobState.QUEUED
    stored = Job.objects.get(pk=job.pk)
    assert (stored.not_before, stored.wait_reason) == (None, "")
    assert JobAttempt.objects.get(pk=attempt.pk).outcome == "preempted"
    assert stored.current_hold_id != attempt.hold_id


def test_only_lost_nodes_use_retries_not_preemptions_or_evictions(
    running: Callable[..., tuple[Job, JobAttempt]], make_attempt: Callable[..., JobAttempt],
    fleet: dict[str, Any],
) -> None:
    """Mutation testing, session 18: counting preempted and evicted attempts as retries went
    unnoticed: a job preempted or evicted (no fault of its own) would then fail retries-exhausted
    at its first node loss."""
    job, attempt = running(max_retries=1)
    for reason in ("preempted", "evicted"):
        request_stop(attempt=attempt, reason=reason, grace_seconds=60)
        assert finish_attempt(attempt=attempt, outcome="failed", exit_code=143).state == JobState.QUEUED
        assert JobAttempt.objects.get(pk=attempt.pk).outcome == reason
        attempt = relaunch(job, make_attempt, fleet)
    result = finish_attempt(attempt=attempt, outcome="lost")  # the first loss: one retry left
    assert (result.state, result.end_reason) == (JobState.QUEUED, "")
    assert Job.objects.get(pk=job.pk).wait_reason == "backoff"


def test_cancel_of_a_running_job_completes_on_exit(running: Callable[..., tuple[Job, JobAttempt]]) -> None:
    job, attempt = running()
    cancel_job(job=job, actor=job.user)
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    result = finish_attempt(attempt=attempt, outcome="failed", exit_code=143)
    assert (result.state, result.end_reason) == (JobState.CANCELLED, "cancelled")
    assert Hold.objects.get(pk=attempt.hold_id).state == HoldState.SETTLED


def test_cancel_of_a_queued_job_releases_its_hold(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job]
) -> None:
    fund(tenant["org"], 50_000_000)
    hold = place_hold(org=tenant["org"], amount=HOLD, key="q", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    job = make_job(JobState.QUEUED, current_hold=hold)
    assert cancel_job(job=job, actor=job.user).state == JobState.CANCELLED
    hold.refresh_from_db()
    assert (hold.state, hold.released) == (HoldState.SETTLED, HOLD)
