"""The job lifecycle: the transition table, starts, stop requests and cancellation in each state."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from audit.models import AuditEvent
from config.clock import db_now
from scheduling.models import Allocation, AttemptState, Job, JobAttempt, JobState
from scheduling.services.lifecycle import (
    TRANSITIONS,
    IllegalTransition,
    UnknownOutcome,
    can_transition,
    cancel_job,
    effective_outcome,
    mark_attempt_started,
    request_stop,
    retry_backoff,
    transition,
)
from tests.factories import fund

pytestmark = pytest.mark.django_db

S = JobState
LEGAL = [(a, b) for a, targets in TRANSITIONS.items() for b in targets]
ILLEGAL = [
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.COMPLETED),
    (S.COMPLETED, S.QUEUED),
    (S.FAILED, S.QUEUED),
    (S.CANCELLED, S.SCHEDULED),
    (S.TIMED_OUT, S.RUNNING),
    (S.PREEMPTED, S.RUNNING),
    (S.RUNNING, S.SCHEDULED),
]


@pytest.mark.parametrize(("start", "end"), LEGAL)
def test_legal_transitions_update_and_audit(
    make_job: Callable[..., Job], start: str, end: str
) -> None:
    job = make_job(start)
    transition(job, end, reason_code="test")
    stored = Job.objects.get(pk=job.pk)
    assert (stored.state, job.state) == (end, end)
    event = AuditEvent.objects.filter(subject_type="job", subject_id=str(job.pk)).get()
    assert event.data["from"] == start and event.data["to"] == end
    assert event.reason_code == "test"
    assert (stored.finished_at is not None) == (end in (S.COMPLETED, S.FAILED, S.CANCELLED, S.TIMED_OUT))


@pytest.mark.parametrize(("start", "end"), ILLEGAL)
def test_illegal_transitions_change_nothing(
    make_job: Callable[..., Job], start: str, end: str
) -> None:
    job = make_job(start)
    assert not can_transition(start, end)
    with pytest.raises(IllegalTransition):
        transition(job, end)
    assert Job.objects.get(pk=job.pk).state == start
    assert not AuditEvent.objects.filter(subject_type="job").exists()


def test_transition_rereads_a_stale_instance(make_job: Callable[..., Job]) -> None:
    job = make_job(S.QUEUED)
    stale = Job.objects.get(pk=job.pk)
    transition(job, S.SCHEDULED)
    # The stale copy still says queued, but the row is scheduled: queued -> scheduled again is refused
    # only because scheduled -> scheduled is not in the table; running is legal from scheduled.
    with pytest.raises(IllegalTransition):
        transition(stale, S.SCHEDULED)
    transition(stale, S.RUNNING)
    assert Job.objects.get(pk=job.pk).state == S.RUNNING


def test_mark_started_is_idempotent(
    make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt]
) -> None:
    job = make_job(S.SCHEDULED)
    attempt = make_attempt(job)
    started = mark_attempt_started(attempt=attempt)
    assert started.state == AttemptState.RUNNING and started.started_at is not None
    again = mark_attempt_started(attempt=attempt)
    assert again.started_at == started.started_at
    assert Job.objects.get(pk=job.pk).state == S.RUNNING
    assert AuditEvent.objects.filter(subject_type="job", reason_code="started").count() == 1


def test_request_stop_sets_grace_and_cancel_overrides(
    make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt]
) -> None:
    job = make_job(S.RUNNING)
    attempt = make_attempt(job, AttemptState.RUNNING)
    stopped = request_stop(attempt=attempt, reason="preempted", grace_seconds=120)
    assert (stopped.state, stopped.stop_reason, stopped.grace_seconds) == (
        AttemptState.STOPPING, "preempted", 120,
    )
    first_at = stopped.stop_requested_at
    assert request_stop(attempt=attempt, reason="preempted", grace_seconds=5).grace_seconds == 120
    cancelled = request_stop(attempt=attempt, reason="cancelled", grace_seconds=10)
    # The reason changes (the job ends cancelled), the kill time does not: the agent keeps the
    # first stop's grace, and the record must say what will happen (QA: it said 30 s, ran 120 s).
    assert (cancelled.stop_reason, cancelled.stop_requested_at, cancelled.grace_seconds) == (
        "cancelled", first_at, 120,
    )
    events = AuditEvent.objects.filter(action="sched.attempt.stop").order_by("id")
    assert [e.data["grace_seconds"] for e in events] == [120, 120]
    assert events.last().data["overrides"] == "preempted"


def test_started_after_stop_keeps_stopping(
    make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt]
) -> None:
    job = make_job(S.SCHEDULED)
    attempt = make_attempt(job)
    request_stop(attempt=attempt, reason="cancelled", grace_seconds=5)
    started = mark_attempt_started(attempt=attempt)
    assert started.state == AttemptState.STOPPING and started.started_at is not None
    assert Job.objects.get(pk=job.pk).state == S.RUNNING


def test_cancel_queued_without_hold_is_immediate_and_idempotent(make_job: Callable[..., Job]) -> None:
    job = make_job(S.QUEUED, hold=False, wait_reason="resources")
    cancelled = cancel_job(job=job, actor=job.user)
    assert cancelled.state == S.CANCELLED and cancelled.end_reason == "cancelled"
    stored = Job.objects.get(pk=job.pk)
    assert (stored.state, stored.wait_reason) == (S.CANCELLED, "")
    assert cancel_job(job=job, actor=job.user).state == S.CANCELLED
    event = AuditEvent.objects.get(subject_type="job", reason_code="cancelled")
    assert (event.actor_type, event.actor_id) == ("user", str(job.user_id))


@pytest.mark.parametrize("state", [S.SCHEDULED, S.RUNNING])
def test_cancel_live_job_requests_stop_and_waits_for_exit(
    make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt], fleet: dict[str, Any],
    state: str,
) -> None:
    job = make_job(state)
    attempt_state = AttemptState.RUNNING if state == S.RUNNING else AttemptState.SCHEDULED
    attempt = make_attempt(job, attempt_state)
    Allocation.objects.create(attempt=attempt, node=fleet["node"], gpu_index=0,
                              allocated_at=attempt.scheduled_at)
    result = cancel_job(job=job, actor=job.user)
    assert result.state == state  # becomes cancelled when the agent reports the exit
    attempt.refresh_from_db()
    assert (attempt.state, attempt.stop_reason) == (AttemptState.STOPPING, "cancelled")
    assert Allocation.objects.filter(attempt=attempt, released_at__isnull=True).count() == 1
    assert AuditEvent.objects.filter(action="sched.job.cancel_requested").count() == 1


@pytest.mark.parametrize("state", [S.COMPLETED, S.FAILED, S.TIMED_OUT])
def test_cancel_ended_job_is_refused(make_job: Callable[..., Job], state: str) -> None:
    job = make_job(state)
    with pytest.raises(IllegalTransition):
        cancel_job(job=job, actor=None)
    assert Job.objects.get(pk=job.pk).state == state


def test_requested_stop_explains_the_exit(
    make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt]
) -> None:
    attempt = make_attempt(make_job(S.RUNNING), AttemptState.STOPPING, stop_reason="preempted")
    assert effective_outcome(attempt, "failed") == "preempted"
    assert effective_outcome(attempt, "completed") == "completed"
    plain = JobAttempt(stop_reason="")
    assert effective_outcome(plain, "lost") == "lost"
    with pytest.raises(UnknownOutcome):
        effective_outcome(plain, "exploded")


def test_backoff_doubles_and_caps(settings: Any) -> None:
    settings.SCHEDULER_RETRY_BACKOFF_SECONDS = 10
    settings.SCHEDULER_RETRY_BACKOFF_MAX_SECONDS = 60
    assert [retry_backoff(n).total_seconds() for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]


def test_request_stop_many_matches_request_stop(
    make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt]
) -> None:
    from scheduling.services.lifecycle import request_stop_many

    running = make_attempt(make_job(S.RUNNING), AttemptState.RUNNING)
    scheduled = make_attempt(make_job(S.SCHEDULED), AttemptState.SCHEDULED)
    stopping = make_attempt(make_job(S.RUNNING), AttemptState.RUNNING)
    request_stop(attempt=stopping, reason="cancelled", grace_seconds=9)
    before = AuditEvent.objects.filter(action="sched.attempt.stop").count()
    out = request_stop_many(
        items=[(running.pk, 120), (scheduled.pk, None), (stopping.pk, 5)], reason="preempted"
    )
    assert (out[running.pk].state, out[running.pk].stop_reason, out[running.pk].grace_seconds) == (
        AttemptState.STOPPING, "preempted", 120,
    )
    assert out[scheduled.pk].stop_reason == "preempted" and out[scheduled.pk].stop_requested_at
    # Already stopping for a cancellation: unchanged, not audited again.
    assert (out[stopping.pk].stop_reason, out[stopping.pk].grace_seconds) == ("cancelled", 9)
    assert AuditEvent.objects.filter(action="sched.attempt.stop").count() == before + 2
    assert request_stop_many(items=[(running.pk, 1)], reason="preempted")[running.pk].grace_seconds == 120


def test_a_refused_refunding_keeps_the_longer_backoff_its_words_and_is_audited(
    fleet: dict[str, Any], make_job: Callable[..., Job], make_attempt: Callable[..., JobAttempt]
) -> None:
    """QA: the refusal's explanation was overwritten by the pass's generic budget detail, a node
    loss's backoff was cut to the funding retry, and nothing recorded the refusal."""
    from scheduling.services.lifecycle import requeue
    from scheduling.services.tick import run_scheduling_pass

    job = make_job(S.RUNNING, hold=False)  # the org has no credits: any new hold is refused
    later = db_now() + timedelta(hours=2)
    requeue(job=job, not_before=later, reason_code="requeued-after-node-lost")
    job.refresh_from_db()
    assert (job.state, job.wait_reason, job.not_before) == (S.QUEUED, "budget", later)
    words = job.wait_detail
    assert words and words != "hold could not be funded"
    refused = AuditEvent.objects.get(action="sched.job.funding_refused", subject_id=str(job.pk))
    assert refused.data["detail"] == words
    # Once offered (backoff over), the pass skips it for budget and keeps the refusal's words.
    Job.objects.filter(pk=job.pk).update(not_before=db_now() - timedelta(seconds=1))
    run_scheduling_pass(trigger="test")
    assert Job.objects.get(pk=job.pk).wait_detail == words


def test_a_requeue_prices_the_estimate_for_the_whole_run_and_holds_one_window(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job]
) -> None:
    """The fresh hold covers the org's hold window; the estimate, as at submission, the max wall
    time (it was set to the hold's amount)."""
    from scheduling.services.lifecycle import requeue
    from tests.scheduling.conftest import H100_PRICE

    fund(tenant["org"], 100 * H100_PRICE)
    tenant["org"].hold_window_seconds = 600
    tenant["org"].save(update_fields=["hold_window_seconds"])
    job = make_job(S.RUNNING, hold=False, gpu_count=2, max_wall_seconds=3 * 3600)
    requeue(job=job, not_before=None, reason_code="requeued-after-preemption")
    job.refresh_from_db()
    assert job.current_hold is not None and job.current_hold.authorized == 2 * H100_PRICE // 6  # 10 min
    assert job.estimate == 2 * 3 * H100_PRICE  # 3 h on 2 GPUs of the dearer type (H100)


def test_a_held_job_waiting_for_funds_stays_held_and_is_funded_when_released(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job]
) -> None:
    """QA: the funding retry overwrote a held job's wait with `budget` (it left the `held` filter),
    and its release said `backoff` (the funding retry time) until the next funding try."""
    from scheduling.services.holding import hold_job, release_job
    from scheduling.services.lifecycle import fund_waiting_jobs, requeue

    job = make_job(S.RUNNING, hold=False)  # the org has no credits: its new hold is refused
    requeue(job=job, not_before=None, reason_code="requeued-after-preemption")
    job = hold_job(job=Job.objects.get(pk=job.pk), actor=tenant["user"])
    Job.objects.filter(pk=job.pk).update(funding_retry_at=db_now() - timedelta(seconds=1))  # due
    fund_waiting_jobs()
    job.refresh_from_db()
    assert (job.held, job.wait_reason) == (True, "held")
    # Released while still unfunded: tried at once, and it says why it waits.
    Job.objects.filter(pk=job.pk).update(funding_retry_at=db_now() + timedelta(seconds=50))
    job = release_job(job=job, actor=tenant["user"])
    assert (job.held, job.wait_reason) == (False, "budget")
    assert job.wait_detail.startswith("Needs ") and Job.objects.get(pk=job.pk).wait_reason == "budget"
    # Held again, funded meanwhile, released: it gets its hold there and then.
    job = hold_job(job=job, actor=tenant["user"])
    fund(tenant["org"], 10**12)
    job = release_job(job=job, actor=tenant["user"])
    job.refresh_from_db()
    assert job.current_hold is not None and not job.held


@pytest.mark.parametrize("change", ["credits", "budget"])
def test_money_arriving_retries_the_orgs_unfunded_jobs_at_once_and_keeps_a_backoff(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job], change: str,
    django_capture_on_commit_callbacks: Callable[..., Any], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """QA: a job refused for a budget waited for its funding retry (up to two minutes) after the
    budget was raised, still quoting the old limit. Credits issued or a budget set now retry it
    (a task sent after the commit). A lost node's retry backoff stands (review: the first version
    moved `not_before`, where the funding retry was kept too, and cut the backoff)."""
    from budgets.services import set_budget
    from scheduling import tasks
    from scheduling.services.lifecycle import requeue, retry_funding_of

    if change == "budget":
        fund(tenant["org"], 10**12)
        set_budget(org=tenant["org"], period="month", limit=1, enforcement="hard")
    job = make_job(S.RUNNING, hold=False)
    backoff = db_now() + timedelta(seconds=30)
    requeue(job=job, not_before=backoff, reason_code="requeued-after-node-lost")
    job.refresh_from_db()
    assert job.wait_reason == "budget" and job.funding_retry_at > db_now()  # refused, retried later
    sent: list[Any] = []
    monkeypatch.setattr(tasks.retry_org_funding, "delay", sent.append)
    monkeypatch.setattr(tasks, "schedule_soon", lambda **_kw: None)
    with django_capture_on_commit_callbacks(execute=True):
        if change == "credits":
            fund(tenant["org"], 10**12)
        else:
            set_budget(org=tenant["org"], period="month", limit=10**12, enforcement="hard")
    assert sent == [tenant["org"].pk]
    assert retry_funding_of(org_id=tenant["org"].pk) == 1  # what the task runs
    job.refresh_from_db()
    assert job.current_hold is not None and job.funding_retry_at is None
    assert job.not_before == backoff  # the backoff stands


def test_a_failure_after_the_commit_does_not_fail_or_repeat_a_credit_issue(
    tenant: dict[str, Any], django_capture_on_commit_callbacks: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review: an error from the after-commit work came out of `issue_credits` after its commit,
    and its retry wrapper ran the committed issue again, answering "already issued"."""
    from scheduling import tasks

    def broker_down(_org_id: int) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.retry_org_funding, "delay", broker_down)
    with django_capture_on_commit_callbacks(execute=True):
        bucket = fund(tenant["org"], 10**12, reference="po-1")
    assert not getattr(bucket, "replayed", False)


@pytest.mark.parametrize("how", ["beat", "money-arrives"])
def test_a_job_funded_during_its_backoff_says_backoff_not_budget(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job], how: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review: funded mid-backoff, it kept the refusal's `budget` words while holding its credits,
    until the backoff ended and a pass rewrote them."""
    from scheduling import tasks
    from scheduling.services.lifecycle import fund_waiting_jobs, requeue, retry_funding_of
    from scheduling.services.tick import run_scheduling_pass

    monkeypatch.setattr(tasks, "schedule_soon", lambda **_kw: None)
    job = make_job(S.RUNNING, hold=False)  # no credits: the new hold is refused
    backoff = db_now() + timedelta(minutes=30)
    requeue(job=job, not_before=backoff, reason_code="requeued-after-node-lost")
    assert Job.objects.get(pk=job.pk).wait_reason == "budget"
    fund(tenant["org"], 10**12)
    if how == "beat":
        Job.objects.filter(pk=job.pk).update(funding_retry_at=db_now() - timedelta(seconds=1))
        assert fund_waiting_jobs() == 1
    else:
        assert retry_funding_of(org_id=tenant["org"].pk) == 1
    run_scheduling_pass()  # not offered (backoff): the pass leaves its wait alone
    job.refresh_from_db()
    assert job.current_hold is not None and job.not_before == backoff
    assert job.wait_reason == "backoff" and job.wait_detail.startswith("retry not before")


def test_money_arriving_leaves_a_held_unfunded_job_held_until_released(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Held, it is not funded by the retry (review probe); released during its backoff, it gets its
    hold and says `backoff`."""
    from scheduling import tasks
    from scheduling.services.holding import hold_job, release_job
    from scheduling.services.lifecycle import fund_waiting_jobs, requeue, retry_funding_of

    monkeypatch.setattr(tasks, "schedule_soon", lambda **_kw: None)
    job = make_job(S.RUNNING, hold=False)
    backoff = db_now() + timedelta(minutes=30)
    requeue(job=job, not_before=backoff, reason_code="requeued-after-node-lost")
    job = hold_job(job=Job.objects.get(pk=job.pk))
    fund(tenant["org"], 10**12)
    assert retry_funding_of(org_id=tenant["org"].pk) == 0 and fund_waiting_jobs() == 0
    job.refresh_from_db()
    assert (job.held, job.wait_reason, job.current_hold) == (True, "held", None)
    job = release_job(job=job)
    job.refresh_from_db()
    assert job.current_hold is not None and job.funding_retry_at is None
    assert (job.wait_reason, job.not_before) == ("backoff", backoff)


def test_a_release_that_funds_a_job_past_a_soft_budget_alerts_as_the_releasing_user(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review: the release's new hold crossed the soft budget, and the alert named the system, not
    the user whose release funded it (a submission's names its user)."""
    from audit.models import AuditEvent
    from budgets.services import set_budget
    from scheduling import tasks
    from scheduling.services.holding import hold_job, release_job
    from scheduling.services.lifecycle import requeue

    monkeypatch.setattr(tasks, "schedule_soon", lambda **_kw: None)
    job = make_job(S.RUNNING, hold=False)
    requeue(job=job, not_before=None, reason_code="requeued-after-node-lost")  # no funds: no hold
    job = hold_job(job=Job.objects.get(pk=job.pk))
    fund(tenant["org"], 10**12)
    set_budget(org=tenant["org"], period="month", limit=1, enforcement="soft")
    release_job(job=Job.objects.get(pk=job.pk), actor=tenant["user"])
    assert Job.objects.get(pk=job.pk).current_hold is not None
    alert = AuditEvent.objects.get(action="budget.soft_limit_exceeded")
    assert (alert.actor_type, alert.actor_id) == ("user", str(tenant["user"].pk))
