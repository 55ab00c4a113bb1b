"""The bounds of charge_progress: a capture never beyond the hold, an extension never beyond what the
run can bill, and the percent trigger for a big hold (mutation testing, session 18)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ledger.models import MICRO, Hold
from metering.charging import Action, extension_amount, lookahead_cost, max_cost
from metering.models import AttemptUsage
from metering.services import charge_progress
from scheduling.models import Job, JobAttempt

pytestmark = pytest.mark.django_db


def _used(attempt: JobAttempt, gpu_ms: int) -> None:
    """The agent reported (and the server allowed) `gpu_ms` of usage (1 micro-credit per GPU-ms)."""
    AttemptUsage.objects.filter(attempt=attempt).update(reported_gpu_ms=gpu_ms, billable_gpu_ms=gpu_ms)


def test_usage_billable_beyond_the_hold_captures_exactly_what_the_hold_has_left(
    make_attempt: Callable[..., JobAttempt], funded: Callable[..., object]
) -> None:
    """Mutation testing, session 18: without `min(…, hold.remaining)` the progress capture asks
    for more than the hold has left and the whole charge run fails (CaptureExceedsHold) for a run
    whose usage got ahead of its hold, so it is never charged, extended or stopped."""
    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=MICRO, max_wall_seconds=36_000, started_ago=36_000)
    _used(attempt, 2 * MICRO)  # twice what the hold holds
    result = charge_progress(attempt=attempt)
    assert result.captured == MICRO
    assert Action.CAPTURED in result.actions
    assert Hold.objects.get(pk=attempt.hold_id).captured == MICRO


def test_an_extension_is_capped_by_what_the_hold_already_pays_for_captured_included(
    make_attempt: Callable[..., JobAttempt], funded: Callable[..., object]
) -> None:
    """Mutation testing, session 18: capped by `max_cost - hold.remaining` (not `- pays_for(hold)`,
    which counts the captures too), a mostly captured hold would be extended past the most its
    run can ever bill, holding credits the org cannot spend elsewhere."""
    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=MICRO, max_wall_seconds=3600)
    job = Job.objects.select_related("org").get(pk=attempt.job_id)
    most = max_cost(attempt, job)
    hold = Hold(authorized=most - 500, captured=most - 1000, released=0)  # pays for all but 500
    assert extension_amount(attempt, job, hold, lookahead_cost(attempt)) == 500
    hold = Hold(authorized=most, captured=most - 1000, released=0)  # pays for the whole run already
    assert extension_amount(attempt, job, hold, lookahead_cost(attempt)) == 0


def test_a_big_hold_with_less_than_the_percent_left_is_extended_though_above_the_look_ahead(
    make_attempt: Callable[..., JobAttempt], funded: Callable[..., object]
) -> None:
    """Mutation testing, session 18: dropping the METERING_EXTEND_WHEN_LEFT_PERCENT trigger (10 %)
    left a big hold to run down to the look-ahead before any extension, too late for a refused one
    to stop the run gracefully on what was left."""
    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=10 * MICRO, max_wall_seconds=36_000, started_ago=36_000)
    _used(attempt, 9_300_000)  # 0.7 credits left: under 10 % of the hold, above the look-ahead
    assert lookahead_cost(attempt) < 700_000
    result = charge_progress(attempt=attempt)
    assert result.actions == (Action.CAPTURED, Action.EXTENDED)
    assert Hold.objects.get(pk=attempt.hold_id).authorized == 10 * MICRO + result.extended
