"""Expiry boundary, statement refunds, verify_ledger hold checks (mutation testing round 2)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from ledger.clock import ledger_now, shifted
from ledger.models import Hold, HoldLine
from ledger.services import expire_due_buckets, issue_refund, place_hold
from ledger.statements import org_statement
from ledger.verification import verify_ledger
from tests.factories import fund

pytestmark = pytest.mark.django_db


def test_bucket_expires_at_exactly_its_expiry_instant(org) -> None:
    now = ledger_now()
    due = fund(org, 40, expires_at=now + timedelta(days=1))
    later = fund(org, 7, expires_at=now + timedelta(days=1, microseconds=1))
    with shifted(timedelta(days=1)):  # the ledger clock is exactly `due`'s expiry instant
        assert ledger_now() == due.expires_at
        assert expire_due_buckets() == 1
    due.refresh_from_db()
    later.refresh_from_db()
    assert (due.available, due.expired) == (0, 40)
    assert (later.available, later.expired) == (7, 0)
    assert verify_ledger() == []


def test_statement_counts_a_refund_as_credits_in_and_adds_up(org) -> None:
    fund(org, 100)
    issue_refund(org=org, amount=30, reference="refund-1", reason="node failure", params={"job": 1})
    statement = org_statement(org=org, month=ledger_now().strftime("%Y-%m"))
    assert (statement.issued, statement.refunded) == (100, 30)
    assert statement.closing.total == 130
    assert statement.closing.total == (statement.opening.total + statement.issued + statement.refunded
                                       - statement.consumed - statement.expired - statement.voided)
    assert [r.amount for r in statement.refunds] == [30]


def test_verify_ledger_reports_hold_postings_without_a_line(org) -> None:
    bucket = fund(org, 100)
    hold = place_hold(org=org, amount=60, key="h")
    HoldLine.objects.filter(hold=hold).delete()
    Hold.objects.filter(pk=hold.pk).update(authorized=0)
    assert verify_ledger() == [f"hold {hold.pk}: postings on bucket {bucket.pk} without a hold line"]


def test_verify_ledger_reports_an_unbalanced_journal_transaction(org) -> None:
    from django.db import connection

    from ledger.models import Account, Posting

    bucket = fund(org, 100)
    posting = Posting.objects.get(bucket=bucket, account=Account.BUCKET_AVAILABLE)
    with connection.cursor() as cursor:  # someone who can bypass the append-only trigger
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # run the deferred checks of the issue now
        cursor.execute("ALTER TABLE ledger_posting DISABLE TRIGGER ledger_posting_append_only")
        cursor.execute("UPDATE ledger_posting SET amount = 150 WHERE id = %s", [posting.pk])
        cursor.execute("ALTER TABLE ledger_posting ENABLE TRIGGER ledger_posting_append_only")
    problems = verify_ledger()
    assert f"transaction {posting.transaction_id}: postings sum to 50, not 0" in problems
    assert f"bucket {bucket.pk}: available is 100, postings say 150" in problems


def test_verify_ledger_reports_a_bucket_column_negative_in_the_journal(org) -> None:
    """Mutation testing round 2: the "negative in the journal" check could be removed unnoticed (a
    tampered posting that drives a bucket's column below zero is also a cached-vs-journal
    difference, but the negative itself must be named)."""
    from django.db import connection

    from ledger.models import Account, Posting

    bucket = fund(org, 100)
    posting = Posting.objects.get(bucket=bucket, account=Account.BUCKET_AVAILABLE)
    with connection.cursor() as cursor:  # someone who can bypass the append-only trigger
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute("ALTER TABLE ledger_posting DISABLE TRIGGER ledger_posting_append_only")
        cursor.execute("UPDATE ledger_posting SET amount = -50 WHERE id = %s", [posting.pk])
        cursor.execute("ALTER TABLE ledger_posting ENABLE TRIGGER ledger_posting_append_only")
    assert f"bucket {bucket.pk}: available negative in the journal (-50)" in verify_ledger()


@pytest.mark.parametrize("sql_path", [True, False], ids=["sql-hot-path", "python-path"])
def test_a_release_at_exactly_the_expiry_instant_goes_to_expiry(org, sql_path: bool, monkeypatch) -> None:
    from ledger.services import _sql, release_hold

    monkeypatch.setattr(_sql, "ENABLED", sql_path)

    now = ledger_now()
    bucket = fund(org, 100, expires_at=now + timedelta(days=1))
    hold = place_hold(org=org, amount=60, key="h")
    with shifted(timedelta(days=1)):  # the ledger clock is exactly the bucket's expiry instant
        assert ledger_now() == bucket.expires_at
        release_hold(hold=hold)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.expired) == (40, 0, 60)
    assert verify_ledger() == []
