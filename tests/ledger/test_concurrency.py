"""Real threads on PostgreSQL: no double-spend, conservation under racing capture/release/expiry."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from ledger.clock import shifted
from ledger.errors import CaptureExceedsHold, HoldNotActive, InsufficientCredits
from ledger.models import Account, Bucket, BucketKind, Hold, HoldState, Posting
from ledger.services import (
    capture,
    expire_due_buckets,
    place_hold,
    release_hold,
    release_partial,
)
from ledger.verification import verify_ledger
from tests.factories import OrganizationFactory, fund

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def run_threads(targets: list[Callable[[], object]]) -> list[object]:
    """Start every target at once (barrier), each on its own DB connection; collect results/errors."""
    barrier = threading.Barrier(len(targets))
    results: list[object] = [None] * len(targets)

    def worker(i: int, fn: Callable[[], object]) -> None:
        try:
            barrier.wait()
            results[i] = fn()
        except Exception as error:  # collected and asserted on by the test
            results[i] = error
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i, fn)) for i, fn in enumerate(targets)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a worker hung"
    return results


def test_64_threads_20_holds_funded() -> None:
    org = OrganizationFactory()
    now = timezone.now()
    # 20 holds of 50 across three buckets of different kinds/expiries (some holds span two).
    fund(org, 330, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(days=3))
    fund(org, 370, expires_at=now + timedelta(days=30))
    fund(org, 300)
    results = run_threads(
        [lambda i=i: place_hold(org=org, amount=50, key=f"job-{i}") for i in range(64)]
    )
    holds = [r for r in results if isinstance(r, Hold)]
    refused = [r for r in results if isinstance(r, InsufficientCredits)]
    assert len(holds) == 20, [r for r in results if not isinstance(r, Hold | InsufficientCredits)]
    assert len(refused) == 44
    assert Hold.objects.filter(org=org).count() == 20
    totals = Bucket.objects.filter(org=org).aggregate(a=Sum("available"), h=Sum("held"))
    assert totals == {"a": 0, "h": 1_000}
    assert not Bucket.objects.filter(available__lt=0).exists()
    assert verify_ledger() == []


def test_same_key_from_many_threads_places_one_hold() -> None:
    org = OrganizationFactory()
    fund(org, 1_000)
    results = run_threads([lambda: place_hold(org=org, amount=70, key="same") for _ in range(16)])
    assert all(isinstance(r, Hold) for r in results), results
    assert len({r.pk for r in results}) == 1
    assert Bucket.objects.get(org=org).held == 70
    assert verify_ledger() == []


def test_racing_capture_release_expiry_conserve_credits() -> None:
    org = OrganizationFactory()
    now = timezone.now()
    promo = fund(org, 400, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(hours=1))
    paid = fund(org, 600)
    hold = place_hold(org=org, amount=600, key="job")  # 400 promo + 200 paid
    with shifted(timedelta(hours=2)):  # the promo bucket is now past its expiry
        targets: list[Callable[[], object]] = []
        targets += [lambda i=i: capture(hold=hold, amount=40, key=f"c{i}") for i in range(10)]
        targets += [lambda i=i: release_partial(hold=hold, amount=30, key=f"r{i}") for i in range(6)]
        targets += [lambda: expire_due_buckets(limit=10) for _ in range(4)]
        targets += [lambda: release_hold(hold=hold, key="final") for _ in range(2)]
        targets += [lambda i=i: place_hold(org=org, amount=100, key=f"other{i}") for i in range(4)]
        results = run_threads(targets)
    errors = [r for r in results if isinstance(r, Exception)]
    allowed = (HoldNotActive, CaptureExceedsHold, InsufficientCredits)
    assert all(isinstance(e, allowed) for e in errors), errors
    hold.refresh_from_db()
    assert hold.state == HoldState.SETTLED
    assert hold.authorized == hold.captured + hold.released == 600
    consumption = Posting.objects.filter(org_id=org.pk, account=Account.CONSUMPTION)
    # A final release may win the race before any capture: no consumption postings at all.
    assert (consumption.aggregate(s=Sum("amount"))["s"] or 0) == hold.captured
    for bucket in (promo, paid):
        bucket.refresh_from_db()
        parts = (bucket.available, bucket.held, bucket.spent, bucket.expired, bucket.voided)
        assert bucket.granted == sum(parts)
        assert min(bucket.available, bucket.held, bucket.spent, bucket.expired) >= 0
    # Nothing of the expired promo bucket ever returned to `available`.
    assert promo.available == 0 and promo.held == 0
    other_held = Hold.objects.filter(org=org).exclude(pk=hold.pk).aggregate(s=Sum("authorized"))["s"] or 0
    assert paid.held == other_held
    assert verify_ledger() == []
