"""Holding jobs while scheduling passes run, with real threads on real connections: a job ends up
either held and never placed, or placed and the hold refused (409) -- never both."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from config.errors import DomainError
from ledger.services import place_hold
from scheduling.models import Job, JobAttempt, JobState, Node
from scheduling.services.holding import hold_job
from scheduling.services.tick import run_scheduling_pass
from tests.api.concurrency import run_concurrently
from tests.factories import UserFactory, fund

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 24


def test_holds_racing_passes_never_leave_a_held_job_placed(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job]
) -> None:
    Node.objects.filter(pk=fleet["node"].pk).update(gpu_count=64)  # room for every job at once
    fund(tenant["org"], 10**12)
    jobs = []
    for i in range(JOBS):
        hold = place_hold(org=tenant["org"], amount=4_000_000, key=f"race-{i}", project=tenant["project"],
                          user=tenant["user"], gpu_types=["H100"])
        jobs.append(make_job(JobState.QUEUED, current_hold=hold, gpu_types=["H100"], gpu_count=1))
    operator = UserFactory()
    refused: list[int] = []

    def passes() -> None:
        for _ in range(30):
            run_scheduling_pass(trigger="race")

    def holds() -> None:
        for job in reversed(jobs):  # newest first: the passes place the oldest first
            try:
                hold_job(job=job, actor=operator)
            except DomainError:  # placed before the hold: a 409 in the API
                refused.append(job.pk)

    run_concurrently([passes, holds])  # released together; an exception in either fails the test
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        placed = JobAttempt.objects.filter(job=job).exists()
        if job.held:
            assert not placed and job.state == JobState.QUEUED and job.wait_reason == "held", job.pk
        else:
            assert placed and job.pk in refused, job.pk
    # Both outcomes happen in practice (18-23 of 24 placed before their hold in 28 local runs: the
    # first pass places most of the queue while the holds commit, and its writer then refuses the
    # ones held since its snapshot); which jobs end which way is up to the race.
    assert 0 < len(refused) < JOBS, f"{len(refused)} of {JOBS} holds refused: the race did not happen"
