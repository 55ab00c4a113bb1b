"""A job queued before windowed holds were floored at the metering look-ahead (b668b6c), with a
60 s windowed hold: topped up, or told why not, as "window-floor", not as a price rise (review)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from audit.models import AuditEvent
from ledger.models import Hold
from ledger.services import place_hold
from ledger.verification import verify_ledger
from scheduling.models import Job, JobAttempt, JobState
from scheduling.pricing import cost
from scheduling.services.tick import run_scheduling_pass
from tests.factories import fund
from tests.scheduling.conftest import H100_PRICE

pytestmark = pytest.mark.django_db


def _legacy_job(tenant: dict[str, Any], make_job: Callable[..., Job]) -> tuple[Job, Hold]:
    """Submitted before b668b6c: window 60 s, hold = 2 GPUs x 60 s at H100's (unchanged) price."""
    tenant["org"].hold_window_seconds = 60
    tenant["org"].save(update_fields=["hold_window_seconds"])
    amount = cost(2 * 60 * 1000, H100_PRICE)
    hold = place_hold(org=tenant["org"], amount=amount, key="legacy", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    job = make_job(JobState.QUEUED, current_hold=hold, estimate=cost(2 * 3600 * 1000, H100_PRICE),
                   gpu_types=["H100"], gpu_count=2, max_wall_seconds=3600)
    return job, hold


def test_legacy_60s_hold_refused_top_up_does_not_claim_a_price_rise(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    fund(tenant["org"], cost(2 * 60 * 1000, H100_PRICE))  # exactly the legacy hold
    job, _ = _legacy_job(tenant, make_job)

    run_scheduling_pass(trigger="test")

    job.refresh_from_db()
    assert verify_ledger() == []
    assert not JobAttempt.objects.filter(job=job).exists()
    # Capped: its hold "covers" 60/273 of H100's price, so it is placed nowhere; after the cap the
    # top-up is tried and refused again, for as long as the org's funds stay short.
    from datetime import timedelta

    from config.clock import db_now

    Job.objects.filter(pk=job.pk).update(price_capped_until=db_now() - timedelta(seconds=1))
    run_scheduling_pass(trigger="test")
    assert not JobAttempt.objects.filter(job=job).exists()
    assert AuditEvent.objects.filter(action="sched.skip", subject_id=str(job.pk)).count() == 2
    # No price changed: H100 costs what the hold was priced at.
    job.refresh_from_db()
    assert job.wait_detail.startswith("the hold pays for the org's 60 s hold window; this job's must pay "
                                      "for 273 s"), job.wait_detail
    # The whole refusal, amounts and all (review: cut at 255 characters, it lost them).
    assert len(job.wait_detail) > 255 and job.wait_detail.endswith("only 0.00 available."), job.wait_detail


def test_legacy_60s_hold_funded_top_up_is_not_audited_as_a_price_rise(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    fund(tenant["org"], 100 * 1_000_000)
    job, _ = _legacy_job(tenant, make_job)

    run_scheduling_pass(trigger="test")

    assert JobAttempt.objects.filter(job=job).exists()
    ev = AuditEvent.objects.get(action="sched.hold.top_up", subject_id=str(job.pk))
    assert ev.reason_code == "window-floor", ev.data


def test_the_words_name_what_this_jobs_hold_must_pay_for(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
) -> None:
    """Review: for a job shorter than the look-ahead the words claimed it needed the look-ahead; its hold
    must pay for its 120 s max wall time."""
    tenant["org"].hold_window_seconds = 60
    tenant["org"].save(update_fields=["hold_window_seconds"])
    amount = cost(2 * 60 * 1000, H100_PRICE)
    fund(tenant["org"], amount)
    hold = place_hold(org=tenant["org"], amount=amount, key="legacy", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    job = make_job(JobState.QUEUED, current_hold=hold, estimate=cost(2 * 120 * 1000, H100_PRICE),
                   gpu_types=["H100"], gpu_count=2, max_wall_seconds=120)
    run_scheduling_pass(trigger="test")
    job.refresh_from_db()
    assert not JobAttempt.objects.filter(job=job).exists()
    assert "this job's must pay for 120 s" in job.wait_detail, job.wait_detail
