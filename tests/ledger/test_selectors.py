"""What a hold's releases became: back to the org, or to expiry (QA: credits lost to expiry were
shown as "released", as if the org had got them back)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledger.clock import shifted
from ledger.models import BucketKind, Hold
from ledger.selectors import attach_release_split, release_split
from ledger.services import _sql, expire_due_buckets, place_hold, release_hold, release_partial, settle_hold
from ledger.verification import verify_ledger
from tests.factories import fund

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("sql_path", [True, False])
def test_release_split_tells_returned_from_expired(org, monkeypatch, sql_path: bool) -> None:
    monkeypatch.setattr(_sql, "ENABLED", sql_path)
    now = timezone.now()
    fund(org, 3_000_000, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(hours=1))  # drawn first
    fund(org, 10_000_000)
    hold = place_hold(org=org, amount=5_000_000, key="h")
    assert release_split(hold) == (0, 0)
    release_partial(hold=hold, amount=1_000_000, key="p")  # latest-expiring first: the paid bucket
    with shifted(timedelta(hours=2)):
        expire_due_buckets()  # the sweep ran (nothing available: the hold holds all of it)
        release_hold(hold=hold, reason="cancelled")  # 1,000,000 more paid, then 3,000,000 expired
    fresh = Hold.objects.get(pk=hold.pk)
    assert fresh.released == 5_000_000
    assert release_split(fresh) == (2_000_000, 3_000_000)
    assert verify_ledger() == []


def test_settle_after_expiry_and_the_bulk_split(org, django_assert_num_queries: Any) -> None:
    now = timezone.now()
    fund(org, 3_000_000, expires_at=now + timedelta(hours=1))
    gone = place_hold(org=org, amount=3_000_000, key="gone")
    fund(org, 2_000_000)
    kept = place_hold(org=org, amount=1_000_000, key="kept")
    open_ = place_hold(org=org, amount=1_000_000, key="open")
    with shifted(timedelta(hours=2)):
        settle_hold(hold=gone, capture_total=0, reason="cancelled after the sweep")
    release_hold(hold=kept)
    holds = list(Hold.objects.filter(pk__in=[gone.pk, kept.pk, open_.pk]).order_by("pk"))
    with django_assert_num_queries(1):  # one for the lot; none for a hold that released nothing
        attach_release_split([*holds, None])
        assert [release_split(h) for h in holds] == [(0, 3_000_000), (1_000_000, 0), (0, 0)]
