"""A refund naming an attempt is capped by that attempt's captures less that attempt's refunds: not
by the whole job's refunds, and not by its captures alone (mutation testing, session 18)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ledger.errors import RefundExceedsCharges
from ledger.models import MICRO
from ledger.services import capture
from scheduling.models import JobAttempt
from scheduling.selectors import job_refunded
from scheduling.services.refunds import refund_job
from tests.metering.conftest import World
from tests.metering.test_refund_budgets import _second_attempt

pytestmark = pytest.mark.django_db

C = 3 * MICRO  # what each attempt captured


def _two_charged_attempts(make_attempt: Callable[..., JobAttempt], funded: Callable[..., Any],
                          world: World) -> tuple[JobAttempt, JobAttempt]:
    funded(100 * MICRO)
    first = make_attempt(hold_amount=10 * MICRO)
    capture(hold=first.hold, amount=C, key="run1")
    second = _second_attempt(first, world, 10 * MICRO)
    capture(hold=second.hold, amount=C, key="run2")
    return first, second


def test_an_attempt_refunded_in_full_refuses_one_more_micro_credit(make_attempt, funded, world) -> None:
    """Mutation testing, session 18: the attempt cap read `charged` instead of `charged - refunded`,
    so an attempt could be refunded again and again (up to the job's total) while the job-level
    cap still had room from the other attempt: money refunded for a run that never cost it."""
    first, _second = _two_charged_attempts(make_attempt, funded, world)
    refund_job(job_id=first.job_id, amount=C, reason="bad node", key="a1", attempt_number=1)
    with pytest.raises(RefundExceedsCharges) as error:
        refund_job(job_id=first.job_id, amount=1, reason="again", key="a1-more", attempt_number=1)
    assert f"attempt 1 of job {first.job_id}" in error.value.detail
    assert error.value.refundable == 0
    # The job as a whole still has the other attempt's C to give back.
    refund_job(job_id=first.job_id, amount=1, reason="job", key="job-1")


def test_refunding_one_attempt_leaves_the_others_refundable(make_attempt, funded, world) -> None:
    """Mutation testing, session 18: `job_refunded(job, attempt_number=n)` counting every refund of
    the job made attempt 2 look already refunded after attempt 1 was, and its rightful refund was
    refused."""
    first, _second = _two_charged_attempts(make_attempt, funded, world)
    refund_job(job_id=first.job_id, amount=C, reason="attempt 1", key="a1", attempt_number=1)
    refund_job(job_id=first.job_id, amount=C, reason="attempt 2", key="a2", attempt_number=2)
    assert job_refunded(first.job_id, attempt_number=1) == C
    assert job_refunded(first.job_id, attempt_number=2) == C
    assert job_refunded(first.job_id) == 2 * C
