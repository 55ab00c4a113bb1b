"""The nightly reconciliation while money moves, on real connections (review).

It read the journal and the buckets, holds and attempts in separate autocommit statements, each
with its own snapshot: a capture or a settlement committing between two reads was in one and not
the other, and a consistent ledger was reported broken (14 of 15 runs under live captures), each
false report an audit alert and a metric. Now every check reads one snapshot
(`config.snapshot.one_snapshot`). Each test failed before."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from ledger import verification
from ledger.models import MICRO
from ledger.services import capture, place_hold
from metering import sweeps
from metering.heartbeats import HeartbeatItem
from metering.services import ingest_heartbeats, settle_attempt
from scheduling.models import AttemptState, JobAttempt
from tests.factories import OrganizationFactory, fund
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def _commit_on_another_connection(work: Callable[[], Any]) -> None:
    assert Worker(work).start().join().errors == []


def test_a_capture_committing_between_the_postings_and_the_buckets_read_is_no_difference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    org = OrganizationFactory()
    fund(org, 100 * MICRO)
    hold = place_hold(org=org, amount=10 * MICRO, key="running-job")
    postings = verification.bucket_columns_from_postings
    captured: list[bool] = []

    def postings_then_a_capture_commits(*args: Any, **kwargs: Any) -> Any:
        rebuilt = postings(*args, **kwargs)
        if not captured:  # a running job's progress capture commits right after the postings read
            captured.append(True)
            _commit_on_another_connection(
                lambda: capture(hold=hold, amount=MICRO, key="progress-1", reason="usage"))
        return rebuilt

    monkeypatch.setattr(verification, "bucket_columns_from_postings", postings_then_a_capture_commits)
    found = sweeps.reconcile()
    monkeypatch.undo()

    assert captured and found.ledger == []
    assert verification.verify_ledger() == []


def test_reconciliation_under_live_captures_reports_nothing() -> None:
    org = OrganizationFactory()
    for _ in range(20):
        fund(org, 1000 * MICRO)
    holds = [place_hold(org=org, amount=900 * MICRO, key=f"job-{n}") for n in range(20)]
    stop = threading.Event()
    captures = [0]

    def charge() -> None:
        while not stop.is_set():
            for hold in holds:
                captures[0] += 1
                capture(hold=hold, amount=1000, key=f"p{captures[0]}")

    charger = Worker(charge).start()
    try:
        reports = [sweeps.reconcile().ledger for _ in range(15)]
    finally:
        stop.set()
        charger.join()
    assert charger.errors == [] and captures[0] > 15  # captures did commit while it ran
    assert verification.verify_ledger() == []
    assert [report for report in reports if report] == []


def test_an_attempt_settling_during_reconciliation_is_no_captured_mismatch(
    world: Any, funded: Any, make_attempt: Callable[..., JobAttempt], monkeypatch: pytest.MonkeyPatch,
) -> None:
    funded(100 * MICRO)
    attempt = make_attempt(hold_amount=10 * MICRO)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, 2_000_000)])

    def finish() -> None:  # as lifecycle.finish_attempt: the attempt ends and settles at once
        with transaction.atomic():
            JobAttempt.objects.filter(pk=attempt.pk).update(state=AttemptState.ENDED, ended_at=timezone.now())
            settle_attempt(attempt=JobAttempt.objects.get(pk=attempt.pk), outcome="completed")

    journal = sweeps.LedgerTransaction

    class SettlesOnRead:  # the early-release read comes after the usage read: the attempt settles now
        class objects:  # stands in for the manager
            @staticmethod
            def filter(*args: Any, **kwargs: Any) -> Any:
                _commit_on_another_connection(finish)
                return journal.objects.filter(*args, **kwargs)

    monkeypatch.setattr(sweeps, "LedgerTransaction", SettlesOnRead)
    found = sweeps.reconcile()
    monkeypatch.undo()

    assert JobAttempt.objects.get(pk=attempt.pk).state == AttemptState.ENDED
    assert found.captured_mismatch == []
    assert sweeps.reconcile().clean
