"""Review of the refunds (af49b07): keys per caller, a taken reference, terms of a replay, bad bodies,
statements across months, admin actions kept."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission

from ledger.clock import shifted
from ledger.errors import IdempotencyConflict
from ledger.models import MICRO, Bucket, LedgerTransaction, TransactionKind
from ledger.services import issue_credits, void_credits
from ledger.statements import org_statement
from ledger.verification import verify_ledger
from scheduling.models import JobRefund
from scheduling.services.refunds import refund_job
from tests.api.conftest import client_for
from tests.factories import UserFactory
from tests.metering.test_refunds import _charged_job, _finance_user, _post


@pytest.mark.django_db
def test_two_finance_users_with_the_same_key_make_two_refunds(make_attempt, funded, world) -> None:
    """DESIGN §7: an idempotency record is (principal, key). refund_job dedups by (job, key)
    only, so a second finance user's own request is answered with the first user's refund."""
    attempt = _charged_job(make_attempt, funded)
    alice, bob = client_for(_finance_user()), client_for(_finance_user())
    first = _post(alice, attempt.job_id, {"amount": MICRO, "reason": "bad node"}, key="refund-1")
    assert first.status_code == 201
    second = _post(bob, attempt.job_id, {"amount": MICRO, "reason": "another ticket"}, key="refund-1")
    assert second.status_code == 201, (second.status_code, second.json())
    assert JobRefund.objects.filter(job_id=attempt.job_id).count() == 2


@pytest.mark.django_db
def test_other_user_same_key_other_amount_is_not_a_conflict(make_attempt, funded, world) -> None:
    attempt = _charged_job(make_attempt, funded)
    alice, bob = client_for(_finance_user()), client_for(_finance_user())
    assert _post(alice, attempt.job_id, {"amount": MICRO, "reason": "x"}, key="refund-1").status_code == 201
    second = _post(bob, attempt.job_id, {"amount": 2 * MICRO, "reason": "y"}, key="refund-1")
    assert second.status_code == 201, (second.status_code, second.json())


def _taken(org: Any, reference: str) -> Bucket:
    """A bucket holding `reference` from before `refund:` was kept for refunds."""
    bucket = issue_credits(org=org, amount=MICRO, kind="paid", source="purchase", reference="inv-1",
                           reason="invoice")
    Bucket.objects.filter(pk=bucket.pk).update(reference=reference)
    bucket.refresh_from_db()
    return bucket


def _state(bucket: Bucket) -> dict[str, Any]:
    return Bucket.objects.filter(pk=bucket.pk).values(
        "reference", "source", "granted", "available", "held", "spent", "expired", "voided", "expires_at"
    ).get()


@pytest.mark.django_db
def test_finance_may_not_issue_a_reference_kept_for_refunds(world) -> None:
    from ledger.errors import InvalidParameter

    with pytest.raises(InvalidParameter, match="kept for refunds"):
        issue_credits(org=world.org, amount=MICRO, kind="paid", source="purchase",
                      reference="refund:job:1:k1", reason="invoice")


@pytest.mark.django_db
def test_a_reference_already_used_by_a_grant_is_a_clean_error(make_attempt, funded, world) -> None:
    """The refund inserted a bucket with the same (org, reference) and died on the unique constraint."""
    attempt = _charged_job(make_attempt, funded)
    reference = f"refund:job:{attempt.job_id}:k1"
    grant = _taken(world.org, reference)
    before = _state(grant)
    refunds = LedgerTransaction.objects.filter(org=world.org, kind=TransactionKind.REFUND).count()
    with pytest.raises(IdempotencyConflict, match=re.escape(f"Reference '{reference}' is already used")):
        refund_job(job_id=attempt.job_id, amount=MICRO, reason="bad node", key="k1")
    # Nothing was refunded, and the grant holding the reference was neither taken for the refund
    # nor touched.
    assert not JobRefund.objects.filter(job_id=attempt.job_id).exists()
    assert LedgerTransaction.objects.filter(org=world.org, kind=TransactionKind.REFUND).count() == refunds
    assert _state(grant) == before


@pytest.mark.django_db
def test_the_api_answers_a_taken_reference_without_a_500(make_attempt, funded, world) -> None:
    attempt = _charged_job(make_attempt, funded)
    finance = _finance_user()
    _taken(world.org, f"refund:job:{attempt.job_id}:{finance.pk}:k1")
    api = client_for(finance)
    api.raise_request_exception = False
    response = _post(api, attempt.job_id, {"amount": MICRO, "reason": "bad node"}, key="k1")
    assert response.status_code == 422, (response.status_code, response.json())


@pytest.mark.django_db
def test_bad_bodies_are_4xx_never_500(make_attempt, funded, world) -> None:
    attempt = _charged_job(make_attempt, funded)
    api = client_for(_finance_user())
    api.raise_request_exception = False
    for bad in ({"amount": 1.5, "reason": "x"}, {"amount": -1, "reason": "x"},
                {"amount": True, "reason": "x"},
                {"amount": 10**16, "reason": "x"}, {"amount": 10**30, "reason": "x"},
                {"amount": MICRO, "reason": "   "},
                {"amount": MICRO, "reason": "x", "attempt": 2**31},
                {"amount": MICRO, "reason": "x", "attempt": 0},
                {"amount": MICRO, "reason": "x", "expires_at": "2000-01-01T00:00:00Z"},
                {"amount": MICRO, "reason": "x", "expires_at": "2030-01-01T00:00:00"},
                {"amount": MICRO, "reason": "x", "expires_at": "9999-12-31T23:00:00-05:00"}):
        response = _post(api, attempt.job_id, bad)
        assert 400 <= response.status_code < 500, (bad, response.status_code)
    assert JobRefund.objects.count() == 0


@pytest.mark.django_db
def test_a_refund_in_the_next_month_adds_up(make_attempt, funded, world) -> None:
    attempt = _charged_job(make_attempt, funded)
    this = LedgerTransaction.objects.filter(kind=TransactionKind.CAPTURE).first().created_at
    with shifted(timedelta(days=40)):
        refund_job(job_id=attempt.job_id, amount=3 * MICRO, reason="late", key="k1")
        nxt = LedgerTransaction.objects.get(kind=TransactionKind.REFUND).created_at
        a = org_statement(org=world.org, month=this.strftime("%Y-%m"))
        b = org_statement(org=world.org, month=nxt.strftime("%Y-%m"))
    assert a.refunded == 0 and a.consumed == 4 * MICRO
    assert b.refunded == 3 * MICRO and b.opening == a.closing
    for s in (a, b):
        assert s.closing.total == s.opening.total + s.issued + s.refunded - s.consumed - s.expired - s.voided
    assert verify_ledger() == []


@pytest.mark.django_db
def test_operators_and_superusers_keep_their_admin_actions(client, make_attempt, funded) -> None:
    attempt = _charged_job(make_attempt, funded)
    url = "/admin/scheduling/job/"
    operator = UserFactory(is_staff=True)
    operator.user_permissions.add(*Permission.objects.filter(codename__in=("view_job", "operate_job")))
    client.force_login(operator)
    names = [n for n, _ in client.get(url).context["action_form"].fields["action"].choices]
    assert {"cancel", "hold", "release"} <= set(names) and "refund" not in names
    boss = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(boss)
    names = [n for n, _ in client.get(url).context["action_form"].fields["action"].choices]
    assert {"cancel", "hold", "release", "refund"} <= set(names)
    assert attempt.job_id


@pytest.mark.django_db
def test_same_key_other_terms_is_a_conflict_not_a_silent_replay(make_attempt, funded, world) -> None:
    """`_same` compares amount and attempt only: the same key with another expiry (or reason)
    answers the original refund as if it were what was asked (issue_credits compares expires_at)."""
    from django.utils import timezone

    attempt = _charged_job(make_attempt, funded)
    soon = timezone.now() + timedelta(days=7)
    refund_job(job_id=attempt.job_id, amount=MICRO, reason="a", key="k1", expires_at=soon)
    with pytest.raises(IdempotencyConflict, match=r"Key 'k1' was already used to refund job \d+ differently"):
        refund_job(job_id=attempt.job_id, amount=MICRO, reason="b", key="k1", expires_at=None)


@pytest.mark.django_db
def test_refund_replay_after_the_bucket_was_closed_is_a_replay_not_a_conflict(
    make_attempt, funded, world
) -> None:
    """Review: a replay compared the bucket's current expiry; closing the refund bucket (void with
    close) moves it to now, so the very same request retried later was a conflict."""
    attempt = _charged_job(make_attempt, funded)
    first = refund_job(job_id=attempt.job_id, amount=MICRO, reason="bad node", key="k1")
    with shifted(timedelta(hours=1)):  # later (one test transaction: now() would not move)
        void_credits(bucket=first.bucket, reason="clawback", key="v1", close=True)
        first.bucket.refresh_from_db()
        assert first.bucket.closed_at is not None
        again = refund_job(job_id=attempt.job_id, amount=MICRO, reason="bad node", key="k1")
        assert again.pk == first.pk and again.replayed


@pytest.mark.django_db
def test_a_refund_with_the_longest_idempotency_key_is_made(make_attempt, funded, world) -> None:
    """QA: a 254- or 255-character key was refused once the caller's id was put before it."""
    attempt = _charged_job(make_attempt, funded)
    api = client_for(_finance_user())
    response = _post(api, attempt.job_id, {"amount": MICRO, "reason": "x"}, key="k" * 255)
    assert response.status_code == 201, response.json()
    assert JobRefund.objects.get(job_id=attempt.job_id).key.split(":")[1] == "sha256"
