"""Submitting afterok dependents while their dependency fails, with real threads on real
connections: whichever commits first, every dependent ends cancelled with its credits released
(the cascade after the failure, or the beat sweep for one committed after the cascade looked)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ledger.models import HoldState
from scheduling.models import Job, JobAttempt, JobState
from scheduling.services.lifecycle import cancel_orphaned_dependents, finish_attempt
from scheduling.services.submission import JobSpec, submit_job
from tests.api.concurrency import run_concurrently
from tests.api.factories import Tenant
from tests.api.test_job_dependencies import run, submit

pytestmark = pytest.mark.django_db(transaction=True)

DEPENDENTS = 12


def test_dependents_submitted_while_their_dependency_fails_all_end_cancelled(
    api: Any, job_body: Callable, tenant: Tenant
) -> None:
    first = submit(api, job_body)
    attempt = run(first["id"])
    spec = JobSpec(name="after", gpu_types=("H100",), gpu_count=1, max_wall_seconds=600,
                   priority_class="standard", depends_on=(first["id"],))
    submitted: list[int] = []
    go = threading.Event()  # the failure starts once a few dependents exist, racing the rest

    def submissions() -> None:
        for i in range(DEPENDENTS):
            if i == 3:
                go.set()
            try:
                job = submit_job(user=tenant.user, project=tenant.project, spec=spec,
                                 idempotency_key=uuid.uuid4().hex)
                submitted.append(job.pk)
            except Exception as exc:  # a refusal once the failure is visible
                if getattr(exc, "type", "") != "validation-error":
                    raise

    def failure() -> None:
        go.wait(10)
        finish_attempt(attempt=JobAttempt.objects.get(pk=attempt.pk), outcome="failed", exit_code=1)

    run_concurrently([submissions, failure])  # an exception (a deadlock) in either fails the test
    cancel_orphaned_dependents()  # the beat sweep, once
    for job in Job.objects.filter(pk__in=submitted).select_related("current_hold"):
        assert (job.state, job.end_reason) == (JobState.CANCELLED, "dependency-failed"), job.pk
        hold = job.current_hold
        assert hold.state == HoldState.SETTLED and hold.released == hold.authorized, job.pk
    # Refused submissions (after the failure was visible) wrote nothing.
    assert Job.objects.filter(depends_on=first["id"]).count() == len(submitted) >= 3
