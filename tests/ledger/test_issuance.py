"""Issuing and voiding credits: journal, idempotency by reference, bad input writes nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.db import DatabaseError, transaction
from django.utils import timezone

from audit.models import AuditEvent
from ledger.amounts import MAX_AMOUNT
from ledger.clock import shifted
from ledger.errors import (
    IdempotencyConflict,
    InsufficientCredits,
    InvalidAmount,
    InvalidExpiry,
    InvalidParameter,
    UnknownGpuType,
)
from ledger.models import Account, Bucket, BucketKind, BucketSource, LedgerTransaction, Posting
from ledger.services import issue_credits, place_hold, void_credits
from tests.factories import OrganizationFactory, ProjectFactory, UserFactory, fund
from tests.ledger.conftest import assert_journal_consistent

pytestmark = pytest.mark.django_db


def _issue(org, **overrides):
    params = {
        "org": org, "amount": 1_000, "kind": BucketKind.PAID, "source": BucketSource.PURCHASE,
        "reference": "inv-1", "reason": "invoice 1",
    }
    params.update(overrides)
    return issue_credits(**params)


def _counts() -> tuple[int, int, int, int]:
    return (
        Bucket.objects.count(), LedgerTransaction.objects.count(), Posting.objects.count(),
        AuditEvent.objects.count(),
    )


def test_issue_posts_issuance_to_available_and_audits(org) -> None:
    user = UserFactory()
    bucket = _issue(org, actor=user)
    assert (bucket.granted, bucket.available) == (1_000, 1_000)
    txn = LedgerTransaction.objects.get(org=org)
    assert sorted((p.account, p.amount) for p in txn.postings.all()) == [
        (Account.BUCKET_AVAILABLE, 1_000), (Account.ISSUANCE, -1_000)
    ]
    event = AuditEvent.objects.get(action="ledger.issue")
    assert (event.actor_type, event.actor_id) == ("user", str(user.pk))
    assert (event.amount, event.org_id) == (1_000, org.pk)
    assert event.data["reason"] == "invoice 1"
    assert bucket.created_by == user


def test_issue_is_idempotent_by_reference(org) -> None:
    first = _issue(org)
    assert _issue(org).pk == first.pk
    assert LedgerTransaction.objects.count() == 1
    with pytest.raises(IdempotencyConflict):
        _issue(org, amount=2_000)
    other_org = OrganizationFactory()
    assert _issue(other_org).pk != first.pk


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"amount": 0}, InvalidAmount),
        ({"amount": -5}, InvalidAmount),
        ({"amount": 1.5}, InvalidAmount),
        ({"kind": "gold"}, InvalidParameter),
        ({"source": "gift"}, InvalidParameter),
        ({"reason": "  "}, InvalidParameter),
        ({"reference": ""}, InvalidParameter),
        ({"gpu_types": ["Z9000"]}, UnknownGpuType),
        ({"effective_at": "now", "expires_at": "before"}, InvalidExpiry),
        ({"project": "other-org"}, InvalidParameter),
    ],
)
def test_bad_issue_input_writes_nothing(org, gpu_types, overrides, error) -> None:
    now = timezone.now()
    if overrides.get("effective_at") == "now":
        overrides = {"effective_at": now, "expires_at": now - timedelta(seconds=1)}
    if overrides.get("project") == "other-org":
        overrides = {"project": ProjectFactory()}
    before = _counts()
    with pytest.raises(error):
        _issue(org, **overrides)
    assert _counts() == before


def test_void_available_part_only(org) -> None:
    bucket = fund(org, 100)
    place_hold(org=org, amount=30, key="h")
    with pytest.raises(InsufficientCredits, match=r"^Cannot void 0\.000071 credits: only 0\.00007 are"):
        void_credits(bucket=bucket, reason="refund", key="v", amount=71)
    txn = void_credits(bucket=bucket, reason="chargeback", key="v1", amount=20)
    assert not txn.replayed
    again = void_credits(bucket=bucket, reason="chargeback", key="v1", amount=20)
    assert again.pk == txn.pk and again.replayed  # the caller can say nothing new was voided
    # The same key with another amount voids nothing more, and says what the key did.
    with pytest.raises(IdempotencyConflict, match=(
        rf"^This void was done already: it voided 0\.00002 credits of bucket {bucket.pk}\. The same key "
        r"with other terms \(0\.000021 credits\) voids nothing more\.$")):
        void_credits(bucket=bucket, reason="chargeback", key="v1", amount=21)
    with pytest.raises(IdempotencyConflict, match=r"other terms \(everything available, closing it\)"):
        void_credits(bucket=bucket, reason="chargeback", key="v1", close=True)
    void_credits(bucket=bucket, reason="close", key="v2")
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.voided) == (0, 30, 70)
    before = _counts()
    with pytest.raises(InvalidAmount):
        void_credits(bucket=bucket, reason="again", key="v3")
    with pytest.raises(InvalidParameter):
        void_credits(bucket=bucket, reason="", key="v4", amount=1)
    assert _counts() == before
    assert AuditEvent.objects.filter(action="ledger.void").count() == 2
    assert_journal_consistent()


@pytest.mark.parametrize("sql_path", [True, False])
def test_a_closed_bucket_pays_for_nothing_new_and_what_comes_back_expires(org, sql_path, monkeypatch) -> None:
    """QA (session 10): credits a voided bucket's running jobs gave back became available again and
    paid for new jobs. Voiding with `close` ends the bucket's validity now: no new hold draws on it,
    and a later release expires (in the SQL hot path and the Python path alike)."""
    from ledger.errors import InsufficientCredits
    from ledger.services import _sql, capture, release_hold

    monkeypatch.setattr(_sql, "ENABLED", sql_path)
    # Issued earlier (the test's one transaction has one clock reading; a bucket is closed only
    # once it has taken effect).
    bucket = fund(org, 100, effective_at=timezone.now() - timedelta(days=1))
    running = place_hold(org=org, amount=30, key="running")
    txn = void_credits(bucket=bucket, reason="chargeback", key="v", close=True)
    bucket.refresh_from_db()
    assert (txn.amount, bucket.available, bucket.held, bucket.voided) == (70, 0, 30, 70)
    assert bucket.expires_at <= timezone.now()
    closed = AuditEvent.objects.get(action="ledger.bucket_closed", subject_id=str(bucket.pk))
    assert (closed.data["held"], closed.data["expires_at_was"]) == (30, None)
    capture(hold=running, amount=10, key="c")
    release_hold(hold=running)  # the job ends: its 20 unspent credits come back to a closed bucket
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.spent, bucket.expired, bucket.voided) == (0, 0, 10, 20, 70)
    with pytest.raises(InsufficientCredits):
        place_hold(org=org, amount=1, key="new-job")
    # Closing what holds nothing available: only the closing is done (no void transaction).
    other = fund(org, 50, effective_at=timezone.now() - timedelta(days=1))
    place_hold(org=org, amount=50, key="all-of-it")
    assert void_credits(bucket=other, reason="fraud", key="v2", close=True) is None
    other.refresh_from_db()
    assert other.expires_at <= timezone.now() and other.voided == 0
    assert void_credits(bucket=other, reason="fraud", key="v2", close=True) is None  # a retry: done
    with pytest.raises(InvalidAmount):  # closed and nothing available: a plain void has nothing to do
        void_credits(bucket=other, reason="fraud", key="v3")
    assert AuditEvent.objects.filter(action="ledger.bucket_closed", subject_id=str(other.pk)).count() == 1
    assert_journal_consistent()


def test_replaying_the_issue_of_a_closed_bucket_is_still_a_replay(org) -> None:
    """Review: closing moved the bucket's expiry, and the same issue sent again was a 409 conflict."""
    bucket = fund(org, 100, effective_at=timezone.now() - timedelta(days=1), reference="inv-1")
    void_credits(bucket=bucket, reason="chargeback", key="v", close=True)
    again = issue_credits(org=org, amount=100, kind=bucket.kind, source=bucket.source, reference="inv-1",
                          reason="again")
    assert again.pk == bucket.pk and again.replayed is True


def test_without_close_what_comes_back_is_available_again(org) -> None:
    from ledger.services import release_hold

    bucket = fund(org, 100)
    running = place_hold(org=org, amount=30, key="running")
    void_credits(bucket=bucket, reason="partial refund", key="v")
    release_hold(hold=running)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.voided, bucket.expires_at) == (30, 70, None)


@pytest.mark.parametrize("change", ["update", "delete"])
def test_journal_is_append_only_at_the_database(org, change) -> None:
    fund(org, 10)
    posting = Posting.objects.first()
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        if change == "update":
            Posting.objects.filter(pk=posting.pk).update(amount=999)
        else:
            Posting.objects.filter(pk=posting.pk).delete()
    assert Posting.objects.get(pk=posting.pk).amount == posting.amount


def test_finance_group_has_view_issue_and_void_permissions() -> None:
    codes = set(Group.objects.get(name="finance").permissions.values_list("codename", flat=True))
    assert {"issue_credits", "void_credits", "view_bucket", "view_ledgertransaction", "view_hold",
            "view_posting", "view_holdline", "view_auditevent"} <= codes
    assert not any(c.startswith(("add_", "change_", "delete_")) for c in codes)


def test_issue_is_capped_at_max_amount_whatever_the_caller(org) -> None:
    """QA: the admin issued 10^18 micro-credits ten times into one org (balance beyond 64 bits);
    the API's cap now holds in the service itself, so no path can issue more."""
    before = _counts()
    with pytest.raises(InvalidAmount, match="At most 1000000000000000 micro-credits"):
        _issue(org, amount=MAX_AMOUNT + 1)
    assert _counts() == before
    assert _issue(org, amount=MAX_AMOUNT).granted == MAX_AMOUNT == 10**15


@pytest.mark.parametrize("effective", ["given", "empty"])
def test_an_expiry_in_the_past_is_refused(org, effective) -> None:
    """QA: a bucket issued already expired showed as available until the expiry sweep; with an
    empty effective_at the refusal said "must be after the effective time", which confused."""
    now = timezone.now()
    overrides = {"expires_at": now - timedelta(days=30)}
    if effective == "given":
        overrides["effective_at"] = now - timedelta(days=90)
    before = _counts()
    with pytest.raises(InvalidExpiry, match=r"^The expiry is in the past\.$"):
        _issue(org, **overrides)
    assert _counts() == before


def test_a_replay_says_so_and_answers_even_after_the_expiry_passed(org) -> None:
    expires = timezone.now() + timedelta(hours=1)
    first = _issue(org, expires_at=expires)
    assert first.replayed is False
    with shifted(timedelta(hours=2)):
        again = _issue(org, expires_at=expires)
    assert (again.pk, again.replayed) == (first.pk, True)
    assert LedgerTransaction.objects.filter(org=org).count() == 1
