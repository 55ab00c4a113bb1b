"""The single-leader lock, with real threads on real connections, and ticks through a real Celery worker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from celery.contrib.testing.worker import start_worker
from django.db import connection, transaction

from config.celery import app
from ledger.services import place_hold
from scheduling import core
from scheduling.models import Allocation, Job, JobAttempt, JobState, SchedulerPass
from scheduling.services.leader import try_lead
from scheduling.services.tick import run_scheduling_pass
from scheduling.tasks import scheduler_tick
from tests.factories import fund

pytestmark = pytest.mark.django_db(transaction=True)


def funded_job(tenant: dict[str, Any], make_job: Callable[..., Job], key: str) -> Job:
    hold = place_hold(org=tenant["org"], amount=6_000_000, key=key, project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    return make_job(JobState.QUEUED, current_hold=hold, gpu_types=["H100"], gpu_count=2)


def test_a_second_pass_returns_none_while_the_leader_runs(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job]
) -> None:
    fund(tenant["org"], 50_000_000)
    job = funded_job(tenant, make_job, "k1")
    leading, release = threading.Event(), threading.Event()

    def leader() -> None:
        try:
            with transaction.atomic():
                assert try_lead()
                leading.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=leader)
    thread.start()
    assert leading.wait(10)
    try:
        assert run_scheduling_pass(trigger="second") is None
        assert SchedulerPass.objects.count() == 0
        assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    finally:
        release.set()
        thread.join(10)
    assert run_scheduling_pass(trigger="after") is not None  # the lock went with the transaction
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED


def test_concurrent_passes_place_each_job_exactly_once(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fund(tenant["org"], 50_000_000)
    jobs = [funded_job(tenant, make_job, f"k{i}") for i in range(3)]
    barrier = threading.Barrier(4)
    results: list[Any] = []
    errors: list[BaseException] = []
    not_leading = threading.Semaphore(0)
    others_gave_up: list[bool] = []
    decide = core.schedule

    def decide_once_the_others_gave_up(snapshot: core.Snapshot) -> core.Result:
        # The passes overlap for sure: the leader decides only once the three others have found
        # the lock taken and returned (without it, each waits here in vain and all four place).
        others_gave_up.append(all(not_leading.acquire(timeout=5) for _ in range(3)))
        return decide(snapshot)

    monkeypatch.setattr(core, "schedule", decide_once_the_others_gave_up)

    def run() -> None:
        try:
            barrier.wait(10)
            result = run_scheduling_pass(trigger="race")
            results.append(result)
            if result is None:
                not_leading.release()
        except BaseException as error:  # surfaced below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    ran = [r for r in results if r is not None]
    # Exactly one of the four concurrent passes led; the three others did nothing.
    assert others_gave_up == [True]
    assert len(results) == 4 and len(ran) == 1 and ran[0].placed == 3
    for job in jobs:
        assert JobAttempt.objects.filter(job=job).count() == 1
    live = list(Allocation.objects.filter(released_at__isnull=True).values_list("node_id", "gpu_index"))
    assert len(live) == len(set(live)) == 6


@pytest.mark.slow
def test_ticks_through_a_real_celery_worker_place_a_submitted_job(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job]
) -> None:
    fund(tenant["org"], 50_000_000)
    job = funded_job(tenant, make_job, "celery")
    # A queue of our own: other test runs may share this Redis broker.
    queue = f"test-scheduler-{uuid.uuid4().hex[:8]}"
    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10, queues=[queue]):
        scheduler_tick.apply_async(kwargs={"trigger": "celery-test"}, queue=queue)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if Job.objects.get(pk=job.pk).state == JobState.SCHEDULED:
                break
            time.sleep(0.2)
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED
    assert SchedulerPass.objects.filter(trigger="celery-test").count() == 1


def test_the_lock_ends_with_the_leaders_transaction_not_its_connection() -> None:
    """Mutation testing round 2: a leader whose pass committed, its connection still open (a
    worker between ticks), must not keep every other process from leading."""
    committed, release = threading.Event(), threading.Event()

    def leader() -> None:
        try:
            with transaction.atomic():
                assert try_lead()
            committed.set()
            release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=leader)
    thread.start()
    assert committed.wait(10)
    try:
        with transaction.atomic():
            assert try_lead()
    finally:
        release.set()
        thread.join(10)
