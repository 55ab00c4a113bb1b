"""settle_attempt: final capture at the fixed rate, exact release, exactly once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.test import Client
from django.utils import timezone

from ledger.models import MICRO, Bucket, HoldState
from metering.heartbeats import HeartbeatItem
from metering.models import AttemptUsage
from metering.services import ingest_heartbeats, settle_attempt
from scheduling.models import JobAttempt
from tests.metering.conftest import World


def test_settle_captures_usage_cost_and_releases_rest_once(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    bucket = funded(100 * MICRO)
    a = make_attempt(hold_amount=10 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 6_000_000)])
    hold = settle_attempt(attempt=a, outcome="completed")
    assert (hold.state, hold.captured, hold.released) == (HoldState.SETTLED, 6 * MICRO, 4 * MICRO)
    again = settle_attempt(attempt=a, outcome="completed")
    assert (again.captured, again.released) == (6 * MICRO, 4 * MICRO)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.spent) == (94 * MICRO, 0, 6 * MICRO)
    u = AttemptUsage.objects.get(pk=a.pk)
    assert u.settled_at is not None and u.captured_gpu_ms == 6_000_000
    # Usage is frozen once settled: a late heartbeat moves nothing.
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 9, 9_000_000)])
    assert AttemptUsage.objects.get(pk=a.pk).billable_gpu_ms == 6_000_000
    assert Bucket.objects.get(pk=bucket.pk).spent == 6 * MICRO


def test_usage_beyond_the_hold_is_never_captured(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    funded(100 * MICRO)
    a = make_attempt(hold_amount=1 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 5_000_000)])
    hold = settle_attempt(attempt=a, outcome="completed")
    assert (hold.captured, hold.released) == (1 * MICRO, 0)


def test_reconciliation_flags_a_capture_that_disagrees_with_usage(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    from django.core.cache import cache

    from audit.models import AuditEvent
    from metering.metrics import RECONCILIATION_CACHE_KEY
    from metering.sweeps import reconcile

    funded(100 * MICRO)
    a = make_attempt(hold_amount=10 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 2_000_000)])
    settle_attempt(attempt=a, outcome="completed")
    from scheduling.models import AttemptState

    JobAttempt.objects.filter(pk=a.pk).update(state=AttemptState.ENDED, ended_at=timezone.now())
    assert reconcile().clean
    # Usage that moved after settlement (a bug elsewhere) no longer matches what was captured.
    AttemptUsage.objects.filter(pk=a.pk).update(billable_gpu_ms=2_500_000, reported_gpu_ms=2_500_000)
    found = reconcile()
    assert found.counts()["captured_mismatch"] == 1
    assert AuditEvent.objects.filter(
        action="metering.reconciliation_alert", reason_code="captured_mismatch"
    ).exists()
    assert cache.get(RECONCILIATION_CACHE_KEY)["counts"]["captured_mismatch"] == 1
    metrics = Client().get("/metrics").content.decode()
    assert 'gpubank_reconciliation_discrepancies{check="captured_mismatch"} 1.0' in metrics


def test_reconciliation_counts_what_was_released_before_settlement(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt]
) -> None:
    """Review: a run that used more than its hold kept after an early release (the excess given
    back at placement) was captured what the hold had left, and reconciliation compared that with
    the whole authorization: a false mismatch."""
    from ledger.services import release_partial
    from metering.sweeps import reconcile
    from scheduling.models import AttemptState

    funded(100 * MICRO)
    a = make_attempt(hold_amount=10 * MICRO)
    release_partial(hold=a.hold, amount=4 * MICRO, key="placed-cheaper")
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(a.pk, 1, 8_000_000)])  # costs 8 credits
    hold = settle_attempt(attempt=a, outcome="completed")
    assert (hold.captured, hold.released) == (6 * MICRO, 4 * MICRO)  # capped at what it held
    JobAttempt.objects.filter(pk=a.pk).update(state=AttemptState.ENDED, ended_at=timezone.now())
    assert reconcile().clean
    # Captured less than the hold held at settlement: still flagged.
    from ledger.models import Hold

    Hold.objects.filter(pk=hold.pk).update(captured=5 * MICRO, released=5 * MICRO)
    assert reconcile().counts()["captured_mismatch"] == 1
