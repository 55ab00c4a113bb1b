"""verify_ledger and the balance breakdown, now and as of a past time."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from ledger.clock import shifted
from ledger.models import BucketKind, Hold, HoldLine
from ledger.selectors import balance_breakdown, org_transactions, project_usage
from ledger.services import (
    capture,
    expire_due_buckets,
    extend_hold,
    place_hold,
    release_hold,
    void_credits,
)
from ledger.verification import verify_ledger
from tests.factories import ProjectFactory, fund

pytestmark = pytest.mark.django_db


def _busy_org(org):
    now = timezone.now()
    promo = fund(org, 100, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(days=5))
    paid = fund(org, 1_000, expires_at=now + timedelta(days=20))
    forever = fund(org, 50)
    hold = place_hold(org=org, amount=300, key="h")
    capture(hold=hold, amount=120, key="c")
    void_credits(bucket=forever, reason="refund", key="v", amount=10)
    return promo, paid, forever, hold


def test_verify_ledger_clean_after_every_operation(org) -> None:
    _, _, _, hold = _busy_org(org)
    release_hold(hold=hold)
    with shifted(timedelta(days=6)):
        expire_due_buckets()
    assert verify_ledger() == []
    out = StringIO()
    call_command("verify_ledger", stdout=out)
    assert "ledger OK" in out.getvalue()


def test_verify_ledger_reports_a_tampered_cache(org) -> None:
    promo, _, _, hold = _busy_org(org)
    # Tamper with the caches the way a buggy direct write would (the journal itself is append-only).
    type(promo).objects.filter(pk=promo.pk).update(available=1, spent=99)
    HoldLine.objects.filter(hold=hold).update(captured=0)
    Hold.objects.filter(pk=hold.pk).update(captured=121, released=0)
    problems = verify_ledger()
    assert any(f"bucket {promo.pk}: available is 1" in p for p in problems)
    assert any(f"bucket {promo.pk}: spent is 99" in p for p in problems)
    assert any(f"hold {hold.pk}: captured is 121, its lines say 0" in p for p in problems)
    assert any(f"hold {hold.pk} line" in p and "captured is 0" in p for p in problems)
    err = StringIO()
    with pytest.raises(CommandError):
        call_command("verify_ledger", stderr=err)
    assert f"bucket {promo.pk}" in err.getvalue()


def test_balance_breakdown_now(org) -> None:
    promo, paid, forever, _ = _busy_org(org)
    b = balance_breakdown(org=org)
    assert b["totals"] == {
        "granted": 1_150, "available": 1_150 - 300 - 10, "held": 180, "spent": 120, "expired": 0,
        "voided": 10, "spendable": 840,
    }
    # The capture of 120 drew the promo bucket (soonest expiry) dry first, then 20 of paid.
    assert (b["promotional"]["held"], b["promotional"]["spent"]) == (0, 100)
    assert (b["paid"]["available"], b["paid"]["held"], b["paid"]["spent"]) == (840, 180, 20)
    # Expiring = still unspent (available + held) in active buckets expiring within the horizon.
    assert b["expiring"] == {"7d": 0, "30d": 800 + 180}
    assert [row["id"] for row in b["buckets"]] == [promo.pk, paid.pk, forever.pk]


def test_balance_as_of_past_time_from_journal(org) -> None:
    now = timezone.now()
    bucket = fund(org, 100, expires_at=now + timedelta(days=2))
    with shifted(timedelta(hours=1)):
        hold = place_hold(org=org, amount=40, key="h")
    with shifted(timedelta(hours=2)):
        capture(hold=hold, amount=30, key="c")
    with shifted(timedelta(days=3)):
        release_hold(hold=hold)
        expire_due_buckets()
        late = balance_breakdown(org=org)
    later = late["totals"]
    assert (later["available"], later["expired"], later["spent"]) == (0, 70, 30)
    at_start = balance_breakdown(org=org, as_of=now + timedelta(minutes=30))["totals"]
    assert (at_start["available"], at_start["held"], at_start["spendable"]) == (100, 0, 100)
    mid = balance_breakdown(org=org, as_of=now + timedelta(hours=1, minutes=30))["totals"]
    assert (mid["available"], mid["held"], mid["spent"]) == (60, 40, 0)
    after = balance_breakdown(org=org, as_of=now + timedelta(hours=3))["totals"]
    assert (after["available"], after["held"], after["spent"]) == (60, 10, 30)
    assert balance_breakdown(org=org, as_of=now - timedelta(days=1))["buckets"] == []
    final = balance_breakdown(org=org, as_of=now + timedelta(days=4))
    assert [r["id"] for r in final["buckets"]] == [bucket.pk]
    assert final["totals"] == {**later, "spendable": 0}


def test_project_breakdown_includes_org_wide_and_own_buckets(org) -> None:
    p1, p2 = ProjectFactory(org=org), ProjectFactory(org=org)
    own = fund(org, 10, project=p1)
    fund(org, 20, project=p2)
    wide = fund(org, 5)
    ids = {r["id"] for r in balance_breakdown(org=org, project=p1)["buckets"]}
    assert ids == {own.pk, wide.pk}


def test_project_usage_counts_only_the_projects_own_holds_now_and_as_of(org) -> None:
    """A project's balance sums buckets it shares; `project_usage` is its own holds only, and is
    the same read from the holds' columns (now) as rebuilt from their postings (as of)."""
    p1, p2 = ProjectFactory(org=org), ProjectFactory(org=org)
    now = timezone.now()
    fund(org, 1_000, expires_at=now + timedelta(days=1))  # org-wide: both projects draw on it
    mine = place_hold(org=org, amount=100, key="mine", project=p1)
    place_hold(org=org, amount=300, key="theirs", project=p2)
    assert project_usage(project=p1) == {"held": 100, "spent": 0}
    with shifted(timedelta(hours=1)):
        extend_hold(hold=mine, amount=50, key="more")
        assert project_usage(project=p1) == {"held": 150, "spent": 0}
    with shifted(timedelta(hours=2)):
        capture(hold=mine, amount=70, key="c")
        assert project_usage(project=p1) == {"held": 80, "spent": 70}
    with shifted(timedelta(days=2)):  # released after the bucket expired: expired, not available
        release_hold(hold=mine)
        expire_due_buckets()
        assert project_usage(project=p1) == {"held": 0, "spent": 70}
    stages = [(timedelta(minutes=30), 100, 0), (timedelta(hours=1, minutes=30), 150, 0),
              (timedelta(hours=3), 80, 70), (timedelta(days=3), 0, 70)]
    for offset, held, spent in stages:
        breakdown = balance_breakdown(org=org, project=p1, as_of=now + offset)
        assert breakdown["project_usage"] == {"held": held, "spent": spent}, offset
    assert balance_breakdown(org=org, project=p1)["totals"]["held"] == 300  # p2's, on the shared bucket
    assert balance_breakdown(org=org)["project_usage"] is None


def test_org_transactions_filters(org) -> None:
    _busy_org(org)
    kinds = [t.kind for t in org_transactions(org=org)]
    assert sorted(kinds) == ["capture", "hold", "issue", "issue", "issue", "void"]
    assert [t.kind for t in org_transactions(org=org, kind="capture")] == ["capture"]
    assert list(org_transactions(org=org, since=timezone.now() + timedelta(days=1))) == []
