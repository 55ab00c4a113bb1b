"""Holds: spend order, applicability, all-or-nothing, capture, release to origin, idempotency."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from ledger.clock import shifted
from ledger.errors import (
    CaptureExceedsHold,
    HoldNotActive,
    IdempotencyConflict,
    InsufficientCredits,
)
from ledger.models import Account, BucketKind, HoldState, LedgerTransaction, Posting
from ledger.services import capture, extend_hold, place_hold, release_hold, release_partial, settle_hold
from tests.factories import ProjectFactory, fund
from tests.ledger.conftest import assert_journal_consistent

pytestmark = pytest.mark.django_db


def _lines(hold) -> dict[int, int]:
    return {ln.bucket_id: ln.authorized for ln in hold.lines.all()}


def test_spend_order_expiry_then_promotional_then_effective(org) -> None:
    now = timezone.now()
    paid_never = fund(org, 100, kind=BucketKind.PAID)
    paid_soon = fund(org, 10, kind=BucketKind.PAID, expires_at=now + timedelta(days=5))
    promo_soon = fund(org, 10, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(days=5))
    promo_late = fund(org, 10, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(days=30))
    promo_never = fund(org, 10, kind=BucketKind.PROMOTIONAL)
    hold = place_hold(org=org, amount=45, key="h1")
    assert _lines(hold) == {
        promo_soon.pk: 10, paid_soon.pk: 10, promo_late.pk: 10, promo_never.pk: 10, paid_never.pk: 5
    }
    paid_never.refresh_from_db()
    assert (paid_never.available, paid_never.held) == (95, 5)
    assert_journal_consistent()


def test_same_expiry_and_kind_orders_by_effective_then_id(org) -> None:
    now = timezone.now()
    later = fund(org, 10, effective_at=now - timedelta(hours=1))
    earlier = fund(org, 10, effective_at=now - timedelta(hours=2))
    hold = place_hold(org=org, amount=15, key="h")
    assert _lines(hold) == {earlier.pk: 10, later.pk: 5}


def test_not_yet_effective_and_expired_buckets_are_not_spent(org) -> None:
    now = timezone.now()
    fund(org, 50, effective_at=now + timedelta(days=1))
    # Issued unexpired (an expiry in the past is refused), then the clock passes it.
    fund(org, 50, effective_at=now - timedelta(days=3), expires_at=now + timedelta(hours=1))
    ok = fund(org, 10)
    with shifted(timedelta(hours=2)):
        with pytest.raises(InsufficientCredits) as info:
            place_hold(org=org, amount=11, key="h")
        assert (info.value.needed, info.value.available) == (11, 10)
        # In credits, as the portal shows money (QA); the fields stay micro-credits for clients.
        assert info.value.detail == "Needs 0.000011 credits, only 0.00001 available."
        assert place_hold(org=org, amount=10, key="h2").lines.get().bucket_id == ok.pk


def test_project_scoped_buckets_only_for_their_project(org) -> None:
    p1, p2 = ProjectFactory(org=org), ProjectFactory(org=org)
    scoped = fund(org, 30, project=p1)
    wide = fund(org, 10)
    with pytest.raises(InsufficientCredits):
        place_hold(org=org, amount=20, key="p2", project=p2)
    with pytest.raises(InsufficientCredits):
        place_hold(org=org, amount=20, key="none")
    hold = place_hold(org=org, amount=35, key="p1", project=p1)
    assert _lines(hold) == {scoped.pk: 30, wide.pk: 5}


def test_gpu_type_applicability(org, gpu_types) -> None:
    h100_only = fund(org, 10, gpu_types=("H100",))
    both = fund(org, 10, gpu_types=("H100", "A100"))
    anything = fund(org, 10)
    hold = place_hold(org=org, amount=30, key="h100", gpu_types=["H100"])
    assert set(_lines(hold)) == {h100_only.pk, both.pk, anything.pk}
    release_hold(hold=hold)
    # A job that may run on A100 or H100 cannot use H100-only credits.
    with pytest.raises(InsufficientCredits) as info:
        place_hold(org=org, amount=21, key="mixed", gpu_types=["A100", "H100"])
    assert info.value.available == 20
    # A hold that may run on any type draws only on unrestricted buckets.
    with pytest.raises(InsufficientCredits):
        place_hold(org=org, amount=11, key="any")


def test_insufficient_is_all_or_nothing(org) -> None:
    fund(org, 10)
    fund(org, 5, kind=BucketKind.PROMOTIONAL)
    before = (LedgerTransaction.objects.count(), Posting.objects.count())
    with pytest.raises(InsufficientCredits):
        place_hold(org=org, amount=16, key="big")
    assert (LedgerTransaction.objects.count(), Posting.objects.count()) == before
    assert not org.holds.exists()
    assert sum(b.available for b in org.buckets.all()) == 15


def test_capture_release_back_to_origin_buckets(org) -> None:
    now = timezone.now()
    soon = fund(org, 10, expires_at=now + timedelta(days=1))
    never = fund(org, 100)
    hold = place_hold(org=org, amount=40, key="h")
    capture(hold=hold, amount=15, key="c1")  # soonest-expiring first: 10 from soon, 5 from never
    hold = release_hold(hold=hold)
    assert hold.state == HoldState.SETTLED
    assert (hold.authorized, hold.captured, hold.released) == (40, 15, 25)
    soon.refresh_from_db()
    never.refresh_from_db()
    assert (soon.available, soon.held, soon.spent) == (0, 0, 10)
    assert (never.available, never.held, never.spent) == (95, 0, 5)
    consumption = Posting.objects.filter(account=Account.CONSUMPTION)
    assert sum(p.amount for p in consumption) == 15
    assert_journal_consistent()


def test_release_partial_returns_latest_expiring_first(org) -> None:
    now = timezone.now()
    soon = fund(org, 10, expires_at=now + timedelta(days=1))
    never = fund(org, 10)
    hold = place_hold(org=org, amount=20, key="h")
    release_partial(hold=hold, amount=12, key="excess")
    soon.refresh_from_db()
    never.refresh_from_db()
    assert (soon.available, soon.held) == (2, 8)
    assert (never.available, never.held) == (10, 0)
    hold.refresh_from_db()
    assert hold.state == HoldState.ACTIVE and hold.remaining == 8


def test_capture_beyond_hold_and_settled_hold_rejected(org) -> None:
    fund(org, 100)
    hold = place_hold(org=org, amount=10, key="h")
    with pytest.raises(CaptureExceedsHold):
        capture(hold=hold, amount=11, key="c")
    with pytest.raises(CaptureExceedsHold):
        release_partial(hold=hold, amount=11, key="r")
    capture(hold=hold, amount=4, key="c1")
    release_hold(hold=hold)
    count = LedgerTransaction.objects.count()
    for call in (
        lambda: release_hold(hold=hold),
        lambda: release_hold(hold=hold, key="other"),
        lambda: capture(hold=hold, amount=1, key="late"),
        lambda: release_partial(hold=hold, amount=1, key="late"),
        lambda: extend_hold(hold=hold, amount=1, key="late"),
    ):
        with pytest.raises(HoldNotActive):
            call()
    assert LedgerTransaction.objects.count() == count


def test_extend_hold_adds_lines(org) -> None:
    a = fund(org, 10)
    hold = place_hold(org=org, amount=8, key="h")
    b = fund(org, 10)
    hold = extend_hold(hold=hold, amount=7, key="w2")
    assert hold.authorized == 15
    assert _lines(hold) == {a.pk: 10, b.pk: 5}
    with pytest.raises(InsufficientCredits):
        extend_hold(hold=hold, amount=6, key="w3")
    assert extend_hold(hold=hold, amount=7, key="w2").authorized == 15
    assert_journal_consistent()


def test_idempotent_retries_and_conflicts(org) -> None:
    fund(org, 100)
    hold = place_hold(org=org, amount=30, key="h")
    assert place_hold(org=org, amount=30, key="h").pk == hold.pk
    with pytest.raises(IdempotencyConflict):
        place_hold(org=org, amount=31, key="h")
    t1 = capture(hold=hold, amount=5, key="c")
    assert capture(hold=hold, amount=5, key="c").pk == t1.pk
    with pytest.raises(IdempotencyConflict):
        capture(hold=hold, amount=6, key="c")
    r1 = release_partial(hold=hold, amount=5, key="r")
    assert release_partial(hold=hold, amount=5, key="r").pk == r1.pk
    extend_hold(hold=hold, amount=5, key="e")
    with pytest.raises(IdempotencyConflict):
        extend_hold(hold=hold, amount=4, key="e")
    release_hold(hold=hold, key="done")
    assert release_hold(hold=hold, key="done").state == HoldState.SETTLED
    hold.refresh_from_db()
    assert (hold.authorized, hold.captured, hold.released) == (35, 5, 30)
    assert_journal_consistent()


def test_settle_hold_exactly_once(org) -> None:
    bucket = fund(org, 100)
    hold = place_hold(org=org, amount=50, key="h")
    capture(hold=hold, amount=10, key="progress")
    hold = settle_hold(hold=hold, capture_total=30, reason="completed")
    assert (hold.state, hold.captured, hold.released) == (HoldState.SETTLED, 30, 20)
    again = settle_hold(hold=hold, capture_total=45, reason="completed")
    assert (again.captured, again.released) == (30, 20)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.spent) == (70, 0, 30)


def test_settle_hold_clamps_to_the_hold(org) -> None:
    fund(org, 100)
    hold = settle_hold(hold=place_hold(org=org, amount=20, key="h"), capture_total=99, reason="x")
    assert (hold.captured, hold.released) == (20, 0)


def test_release_partial_many_matches_release_partial(org) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ledger.services import release_partial_many

    now = timezone.now()
    soon = fund(org, 100, expires_at=now + timedelta(days=5))
    never = fund(org, 100)
    holds = [place_hold(org=org, amount=60, key=f"h{i}") for i in range(3)]  # 60, 40+20, 60
    single = place_hold(org=org, amount=10, key="single")
    with CaptureQueriesContext(connection) as queries:
        txns = release_partial_many(
            items=[(holds[0], 50, "x"), (holds[1], 45, "x"), (holds[2], 1, "x")], reason="excess"
        )
    assert len(queries) < 15  # bulk: not one round trip per row
    assert [t.params for t in txns] == [{"amount": a, "final": False} for a in (50, 45, 1)]
    for hold, released in zip(holds, (50, 45, 1), strict=True):
        hold.refresh_from_db()
        assert (hold.state, hold.released) == (HoldState.ACTIVE, released)
    # Latest-expiring first, as release_partial: hold 1 had 40 from `soon` and 20 from `never`.
    lines = {ln.bucket_id: ln.released for ln in holds[1].lines.all()}
    assert lines == {soon.pk: 25, never.pk: 20}
    assert LedgerTransaction.objects.filter(kind="release").count() == 3
    assert AuditEvent.objects.filter(action="ledger.release").count() == 3
    # Replays return the same transactions; a different amount for a used key is a conflict.
    again = release_partial_many(items=[(holds[0], 50, "x"), (single, 5, "y")])
    assert again[0].pk == txns[0].pk and again[1].key == f"release:{single.pk}:y"
    with pytest.raises(IdempotencyConflict):
        release_partial_many(items=[(holds[1], 44, "x")])
    with pytest.raises(CaptureExceedsHold):
        release_partial_many(items=[(holds[2], 60, "z")])
    assert_journal_consistent()
    from ledger.verification import verify_ledger

    assert verify_ledger() == []


def test_an_extension_for_the_run_type_draws_on_credits_restricted_to_it_and_narrows_the_hold(
    org, gpu_types
) -> None:
    """Review: a run placed on A100, held for A100 and H100, could not be extended from A100 credits."""
    anywhere = fund(org, 10)
    a100 = fund(org, 100, gpu_types=("A100",))
    h100 = fund(org, 100, gpu_types=("H100",))
    hold = place_hold(org=org, amount=8, key="h", gpu_types=["A100", "H100"])
    extend_hold(hold=hold, amount=2, key="own", run_type="A100")  # its own buckets pay: not narrowed
    hold.refresh_from_db()
    assert hold.gpu_types == ["A100", "H100"] and _lines(hold) == {anywhere.pk: 10}
    extend_hold(hold=hold, amount=5, key="more", run_type="A100")
    hold.refresh_from_db()
    assert hold.gpu_types == ["A100"] and _lines(hold) == {anywhere.pk: 10, a100.pk: 5}
    event = AuditEvent.objects.filter(subject_type="ledger.hold", subject_id=str(hold.pk)).latest("id")
    assert event.data["gpu_types"] == {"from": ["A100", "H100"], "to": ["A100"]}
    extend_hold(hold=hold, amount=5, key="other", run_type="H100")  # not its type: ignored
    hold.refresh_from_db()
    h100.refresh_from_db()
    assert hold.gpu_types == ["A100"] and _lines(hold) == {anywhere.pk: 10, a100.pk: 10} and h100.held == 0
    assert_journal_consistent()
