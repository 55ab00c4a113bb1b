"""Review (session 14): a hold placement whose transaction began before a bucket's expiry, and
which waited for that bucket's lock until after it (a capture or release held it; the expiry
sweep skips a locked bucket), drew on the expired bucket: the locked row was re-checked against
the transaction's start time. It is re-checked against the database's wall clock now (ADR 0012,
migration ledger/0010). Real threads, both ledger paths."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

from config.clock import db_now
from ledger.models import MICRO, Bucket, BucketKind, HoldLine
from ledger.services import place_hold
from ledger.verification import verify_ledger
from tests.factories import OrganizationFactory, fund


@pytest.mark.parametrize("busy", ["expiring", "other"])
@pytest.mark.parametrize("sql_path", [True, False], ids=["sql-hot-path", "python-path"])
@pytest.mark.django_db(transaction=True)
def test_a_hold_never_draws_on_a_bucket_that_expired_while_it_waited(
    sql_path: bool, busy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`busy`: whose lock the placement waits for past the expiry: the expiring bucket's, or the
    other bucket's after it locked the expiring one at once (a second review: the SQL path judged
    each bucket right after its own lock, so that one passed before it expired)."""
    from ledger.services import _sql

    monkeypatch.setattr(_sql, "ENABLED", sql_path)
    org = OrganizationFactory()
    expires = db_now() + timedelta(seconds=2)
    promo = fund(org, 10 * MICRO, kind=BucketKind.PROMOTIONAL, expires_at=expires)  # spent first
    paid = fund(org, 10 * MICRO)
    locked, release, placed, errors = threading.Event(), threading.Event(), [], []

    assert promo.pk < paid.pk  # locked first

    def capture_holding_the_bucket() -> None:
        try:
            with transaction.atomic():
                Bucket.objects.select_for_update().get(pk=promo.pk if busy == "expiring" else paid.pk)
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    def submission() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT now()")
                    started = cursor.fetchone()[0]
                placed.append((started, place_hold(org=org, amount=3 * MICRO, key="job-1")))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    holder = threading.Thread(target=capture_holding_the_bucket)
    holder.start()
    assert locked.wait(10)
    placer = threading.Thread(target=submission)
    placer.start()
    time.sleep(0.5)  # it waits for the busy bucket's lock
    while db_now() <= expires + timedelta(milliseconds=100):
        time.sleep(0.05)
    release.set()
    holder.join(30)
    placer.join(30)
    assert not errors, errors
    [(started, hold)] = placed
    assert started < expires  # its transaction began before the expiry
    lines = list(HoldLine.objects.filter(hold=hold).values_list("bucket_id", "authorized"))
    assert lines == [(paid.pk, 3 * MICRO)]  # not a credit of the bucket that had expired
    assert verify_ledger() == []
