"""Finance in the admin: issue and void through services, read-only journal, permissions."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from ledger.models import MICRO, Bucket, Hold, LedgerTransaction
from ledger.services import capture, place_hold, void_credits
from tests.factories import OrganizationFactory, ProjectFactory, UserFactory, fund

pytestmark = pytest.mark.django_db


@pytest.fixture
def finance_client(client):
    user = UserFactory(is_staff=True)
    user.groups.add(Group.objects.get(name="finance"))
    client.force_login(user)
    client.user = user
    return client


@pytest.fixture
def staff_client(client):
    user = UserFactory(is_staff=True)
    client.force_login(user)
    return client


def _issue_form(org, **overrides):
    data = {
        "org": org.pk, "project": "", "source": "grant", "kind": "promotional", "credits": "12.5",
        "reference": "grant-7", "reason": "research grant", "effective_at": "", "expires_at": "",
    }
    data.update(overrides)
    return data


def test_finance_issues_credits_through_the_service(finance_client) -> None:
    org = OrganizationFactory()
    response = finance_client.post(reverse("admin:ledger_bucket_issue"), _issue_form(org))
    assert response.status_code == 302
    bucket = Bucket.objects.get(org=org)
    assert (bucket.granted, bucket.available, bucket.kind) == (12_500_000, 12_500_000, "promotional")
    assert bucket.created_by == finance_client.user
    assert LedgerTransaction.objects.filter(kind="issue", org=org).count() == 1
    event = AuditEvent.objects.get(action="ledger.issue", org_id=org.pk)
    assert event.actor_id == str(finance_client.user.pk)


@pytest.mark.parametrize(
    "overrides",
    [{"reason": ""}, {"credits": "0"}, {"project": "other"},
     {"effective_at": "2030-01-02 00:00", "expires_at": "2030-01-01 00:00"}],
)
def test_issue_form_rejects_bad_input(finance_client, overrides) -> None:
    org = OrganizationFactory()
    if overrides.get("project") == "other":
        overrides = {"project": ProjectFactory().pk}
    response = finance_client.post(reverse("admin:ledger_bucket_issue"), _issue_form(org, **overrides))
    assert response.status_code == 200
    assert not Bucket.objects.filter(org=org).exists()


def test_staff_without_permission_cannot_issue(staff_client) -> None:
    org = OrganizationFactory()
    response = staff_client.post(reverse("admin:ledger_bucket_issue"), _issue_form(org))
    assert response.status_code == 403
    assert not Bucket.objects.exists()


def test_void_action_with_reason(finance_client) -> None:
    org = OrganizationFactory()
    bucket = fund(org, 10 * MICRO)
    place_hold(org=org, amount=3 * MICRO, key="h")
    url = reverse("admin:ledger_bucket_changelist")
    ask = finance_client.post(url, {"action": "void_available", "_selected_action": [bucket.pk]})
    assert ask.status_code == 200 and b"reason" in ask.content
    bucket.refresh_from_db()
    assert bucket.voided == 0
    done = finance_client.post(
        url, {"action": "void_available", "_selected_action": [bucket.pk], "apply": "1", "reason": "refund"}
    )
    assert done.status_code == 302
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.voided) == (0, 3 * MICRO, 7 * MICRO)
    assert bucket.expires_at is None  # "close" unticked: what is held comes back available


def test_void_action_closes_the_bucket_by_default(finance_client) -> None:
    org = OrganizationFactory()
    bucket = fund(org, 10 * MICRO, effective_at=timezone.now() - timedelta(days=1))
    place_hold(org=org, amount=3 * MICRO, key="h")
    url = reverse("admin:ledger_bucket_changelist")
    ask = finance_client.post(url, {"action": "void_available", "_selected_action": [bucket.pk]})
    assert ask.context["form"]["close"].value() is True  # offered ticked
    form = {"action": "void_available", "_selected_action": [bucket.pk], "apply": "1", "reason": "chargeback",
            "close": "on"}
    done = finance_client.post(url, form, follow=True)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.voided) == (0, 7 * MICRO) and bucket.expires_at <= timezone.now()
    assert [str(m) for m in done.context["messages"]] == [
        f"Voided {7 * MICRO} micro-credits of bucket {bucket.pk}; closed: the {3 * MICRO} micro-credits "
        "still held will expire when released."
    ]


def test_journal_holds_audit_are_viewable_but_read_only(finance_client) -> None:
    org = OrganizationFactory()
    fund(org, 10)
    hold = place_hold(org=org, amount=4, key="h")
    txn = LedgerTransaction.objects.filter(kind="hold").get()
    event = AuditEvent.objects.filter(org_id=org.pk).first()
    pages = [
        reverse("admin:ledger_bucket_changelist") + "?q=fund",
        reverse("admin:ledger_ledgertransaction_changelist") + "?kind__exact=hold",
        reverse("admin:ledger_ledgertransaction_change", args=[txn.pk]),
        reverse("admin:ledger_hold_changelist") + "?state__exact=active",
        reverse("admin:ledger_hold_change", args=[hold.pk]),
        reverse("admin:audit_auditevent_changelist") + "?action=ledger.hold",
        reverse("admin:audit_auditevent_change", args=[event.pk]),
    ]
    for url in pages:
        assert finance_client.get(url).status_code == 200, url
    for name in ("ledger_bucket", "ledger_ledgertransaction", "ledger_hold", "audit_auditevent"):
        assert finance_client.get(reverse(f"admin:{name}_add")).status_code == 403
    bucket = Bucket.objects.get(org=org)
    finance_client.post(reverse("admin:ledger_bucket_change", args=[bucket.pk]), {"available": 999})
    bucket.refresh_from_db()
    assert bucket.available == 6
    assert Hold.objects.get(pk=hold.pk).authorized == 4


def test_finance_reads_an_orgs_monthly_statement_and_downloads_it(finance_client) -> None:
    from django.test import Client

    from ledger.clock import ledger_now

    org = OrganizationFactory()
    bucket = fund(org, 10 * MICRO)
    hold = place_hold(org=org, amount=3 * MICRO, key="h")
    capture(hold=hold, amount=2 * MICRO, key="c")
    void_credits(bucket=bucket, reason="refund", key="v", amount=1 * MICRO)
    url = reverse("admin:ledger_bucket_statement")
    month = ledger_now().strftime("%Y-%m")
    assert b"Statements" in finance_client.get(reverse("admin:ledger_bucket_changelist")).content
    page = finance_client.get(url, {"org": org.pk, "month": month})
    assert page.status_code == 200
    rows = dict(page.context["rows"])
    shown = [rows[label] for label in ("Opening balance", "Issued", "Consumed", "Voided", "Closing balance")]
    assert shown == ["0.00", "10.00", "-2.00", "-1.00", "7.00"]
    csv_file = finance_client.get(url, {"org": org.pk, "month": month, "format": "csv"})
    assert csv_file["Content-Type"].startswith("text/csv")
    assert b"closing balance" in csv_file.content and str(7 * MICRO).encode() in csv_file.content
    assert b"A month looks like" in finance_client.get(url, {"org": org.pk, "month": "11/2026"}).content
    staff = Client()
    staff.force_login(UserFactory(is_staff=True))
    assert staff.get(url).status_code == 403  # staff without finance's journal permission
