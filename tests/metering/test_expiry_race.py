"""Review (session 14): a release whose transaction began before a bucket's expiry but got the
bucket's lock after the expiry sweep had committed put the credits back into the `available` of
the expired bucket; the next sweep then reused the journal key `expire:<bucket>` and failed with a
unique violation, every run, for every org in its batch. Real threads, both ledger paths."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction

from config.clock import db_now
from ledger.models import MICRO, BucketKind
from ledger.services import expire_due_buckets
from ledger.verification import verify_ledger
from metering.heartbeats import HeartbeatItem
from metering.services import ExitReport, ingest_heartbeats, report_exit
from scheduling.models import Job, JobAttempt
from tests.factories import ProjectFactory, fund
from tests.metering.conftest import World


@pytest.mark.parametrize("sql_path", [True, False], ids=["sql-hot-path", "python-path"])
@pytest.mark.django_db(transaction=True)
def test_release_straddling_bucket_expiry_goes_to_expiry_and_sweep_keeps_working(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt], sql_path: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ledger.services import _sql

    monkeypatch.setattr(_sql, "ENABLED", sql_path)
    expires = db_now() + timedelta(seconds=4)
    promo = funded(10 * MICRO, kind=BucketKind.PROMOTIONAL, expires_at=expires)
    funded(100 * MICRO)  # paid, never expires
    attempt = make_attempt(hold_amount=4 * MICRO)  # drawn from the promo bucket (soonest expiry)
    ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, 1, 1_000_000)])  # 1 credit

    locked, release, errors = threading.Event(), threading.Event(), []

    def other_job_writer() -> None:  # e.g. a scheduling pass or charge_progress holding the job row
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=attempt.job_id)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    def agent_exit() -> None:  # the agent's exit report, begun before the expiry instant
        try:
            report_exit(node=world.node, attempt_id=attempt.pk,
                        report=ExitReport(seq=2, cumulative_gpu_ms=1_000_000, outcome="completed"))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    holder = threading.Thread(target=other_job_writer)
    holder.start()
    assert locked.wait(10)
    exiter = threading.Thread(target=agent_exit)
    exiter.start()
    time.sleep(0.5)
    with connection.cursor() as cur:  # the exit's transaction is waiting on the job row, begun before expiry
        cur.execute("SELECT xact_start FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()")
        starts = [r[0] for r in cur.fetchall()]
    assert starts and all(s < expires for s in starts)
    while db_now() <= expires + timedelta(milliseconds=200):
        time.sleep(0.1)
    assert expire_due_buckets() == 1  # the promo bucket's available part (6 credits) expires
    release.set()
    holder.join(30)
    exiter.join(30)
    assert not errors, errors

    promo.refresh_from_db()
    assert verify_ledger() == []
    # The 3 credits released after the expiry went to expiry at once (DESIGN.md section 4).
    assert (promo.available, promo.expired) == (0, 9 * MICRO)
    # Another bucket (another org) falls due: the sweep must expire it.
    other = fund(ProjectFactory().org, 5 * MICRO, expires_at=db_now() + timedelta(seconds=1))
    while db_now() <= other.expires_at:
        time.sleep(0.1)
    sweep_error = None
    for _ in range(2):
        try:
            expire_due_buckets()
        except Exception as exc:
            sweep_error = exc
    other.refresh_from_db()
    # And the sweep keeps expiring other buckets (it had failed on the reused journal key
    # `expire:<promo>` every run, rolling back its whole batch: the other org's never expired).
    assert (promo.available, promo.expired, other.available, sweep_error) == (0, 9 * MICRO, 0, None)
