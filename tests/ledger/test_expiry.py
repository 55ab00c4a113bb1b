"""Expiry: available part now, held part as released; in-flight holds stay capturable."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.clock import shifted
from ledger.errors import InsufficientCredits
from ledger.models import Account, BucketKind, LedgerTransaction, Posting
from ledger.services import capture, expire_due_buckets, place_hold, release_hold, release_partial
from tests.factories import fund
from tests.ledger.conftest import assert_journal_consistent

pytestmark = pytest.mark.django_db


def test_expire_moves_available_to_expiry_once(org) -> None:
    now = timezone.now()
    bucket = fund(org, 50, expires_at=now + timedelta(days=1))
    keep = fund(org, 5)
    assert expire_due_buckets() == 0
    with shifted(timedelta(days=2)):
        assert expire_due_buckets() == 1
        assert expire_due_buckets() == 0
    bucket.refresh_from_db()
    keep.refresh_from_db()
    assert (bucket.available, bucket.expired) == (0, 50)
    assert keep.available == 5
    assert LedgerTransaction.objects.filter(kind="expire").count() == 1
    assert_journal_consistent()


def test_bucket_expiring_mid_hold(org) -> None:
    """The seed's drill: promo bucket expires while a job runs against it."""
    now = timezone.now()
    promo = fund(org, 100, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(hours=1))
    paid = fund(org, 100)
    hold = place_hold(org=org, amount=150, key="job")  # 100 promo + 50 paid
    with shifted(timedelta(hours=2)):
        assert expire_due_buckets() == 0  # nothing available in promo: it is all held
        # The in-flight hold is still capturable against the expired bucket...
        capture(hold=hold, amount=60, key="usage")
        # ...but no new hold can draw on it.
        with pytest.raises(InsufficientCredits):
            place_hold(org=org, amount=51, key="new")
        release_partial(hold=hold, amount=30, key="excess")  # from paid first (latest expiry)
        hold = release_hold(hold=hold)  # 40 promo -> expiry, 20 paid -> available
    promo.refresh_from_db()
    paid.refresh_from_db()
    assert (promo.available, promo.held, promo.spent, promo.expired) == (0, 0, 60, 40)
    assert (paid.available, paid.held, paid.spent) == (100, 0, 0)
    expiry = Posting.objects.filter(account=Account.EXPIRY)
    assert sum(p.amount for p in expiry) == 40
    assert_journal_consistent()


def test_release_after_bucket_expired_with_available_left(org) -> None:
    now = timezone.now()
    bucket = fund(org, 100, expires_at=now + timedelta(hours=1))
    hold = place_hold(org=org, amount=30, key="h")
    with shifted(timedelta(hours=2)):
        assert expire_due_buckets() == 1
        release_hold(hold=hold)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.expired) == (0, 0, 100)
    assert_journal_consistent()
