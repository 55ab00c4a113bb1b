"""Review (session 14): the SQL hot path's release decided "expired or not" from an unlocked read
of the bucket's `expires_at` (0006: "fixed attributes ... never updated"), but closing a bucket
(void_credits(close=True)) updates it: a release that ran while a close was committing returned
the credits to the `available` of the closed bucket, although its own clock was after the close.
Fixed by ledger/0009 (the buckets locked before the decision, the wall clock after the locks)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import connection, transaction

from ledger.models import MICRO, Bucket, Hold
from ledger.services import place_hold, release_hold, void_credits
from ledger.verification import verify_ledger
from tests.factories import OrganizationFactory, fund
from tests.lock_waits import another_session_waits


@pytest.mark.parametrize("sql_path", [True, False], ids=["sql-hot-path", "python-path"])
@pytest.mark.django_db(transaction=True)
def test_release_racing_a_close_goes_to_expiry(sql_path: bool, monkeypatch: Any) -> None:
    from ledger.services import _sql

    monkeypatch.setattr(_sql, "ENABLED", sql_path)
    org = OrganizationFactory()
    bucket = fund(org, 10 * MICRO)
    hold = place_hold(org=org, amount=4 * MICRO, key="job-1")
    closing, commit, released, errors = threading.Event(), threading.Event(), threading.Event(), []
    clocks: dict[str, Any] = {}

    def finance_closes() -> None:  # the admin's "Void the available credits" with "close" ticked
        try:
            with transaction.atomic():
                void_credits(bucket=bucket, reason="refund", key="v1", close=True)
                clocks["close"] = Bucket.objects.get(pk=bucket.pk).closed_at
                closing.set()
                commit.wait(30)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def user_cancels() -> None:  # cancel_job -> _release_whole_hold -> release_hold (SQL path)
        try:
            with transaction.atomic():
                with connection.cursor() as cur:
                    cur.execute("SELECT now()")
                    clocks["release"] = cur.fetchone()[0]
                release_hold(hold=Hold.objects.get(pk=hold.pk), key="job:1:cancel", reason="job cancelled")
        except BaseException as exc:
            errors.append(exc)
        finally:
            released.set()
            connection.close()

    f = threading.Thread(target=finance_closes)
    f.start()
    assert closing.wait(10)
    time.sleep(0.05)
    u = threading.Thread(target=user_cancels)
    u.start()
    waited = another_session_waits(released)  # the release read its lines and waits for the bucket row
    commit.set()
    f.join(30)
    u.join(30)
    assert not errors, errors
    assert waited, "the release did not wait for the closing transaction: no race"
    assert clocks["release"] > clocks["close"]  # the release happened after the close, by any clock
    bucket.refresh_from_db()
    assert verify_ledger() == []
    # docs/ledger.md: after a close "what its jobs give back later goes to expiry".
    assert (bucket.available, bucket.expired, bucket.voided) == (0, 4 * MICRO, 6 * MICRO)

