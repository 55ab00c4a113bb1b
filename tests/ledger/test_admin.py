"""Finance in the admin: issue and void through services, read-only journal, permissions."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

import pytest
from django.contrib.auth.models import Group
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from config.form_keys import new_form_key
from ledger.admin import _release_label
from ledger.amounts import MAX_AMOUNT
from ledger.clock import shifted
from ledger.models import MICRO, Bucket, Hold, LedgerTransaction
from ledger.services import capture, place_hold, release_hold, void_credits
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
    key = ask.context["form"]["key"].value()  # made when the form is shown
    done = finance_client.post(url, {"action": "void_available", "_selected_action": [bucket.pk],
                                     "apply": "1", "reason": "refund", "key": key})
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
            "close": "on", "key": ask.context["form"]["key"].value()}
    done = finance_client.post(url, form, follow=True)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.voided) == (0, 7 * MICRO) and bucket.expires_at <= timezone.now()
    assert [str(m) for m in done.context["messages"]] == [
        f"Voided {7 * MICRO} micro-credits of bucket {bucket.pk}; closed: the {3 * MICRO} micro-credits "
        "still held by jobs (running or queued) may still be spent by them; what they give back will expire."
    ]
    # Again (a new form), with nothing left to void: said so (QA: it read "Bucket 10; closed.").
    again = finance_client.post(url, {**form, "key": new_form_key()}, follow=True)
    assert next(str(m) for m in again.context["messages"]).startswith(
        f"Nothing was available to void in bucket {bucket.pk}; closed"
    )


def test_voiding_and_closing_a_bucket_not_yet_in_effect_says_why_it_was_not_closed(finance_client) -> None:
    """QA: "Close the buckets" left a future bucket open without a word (`void_credits` closes only a
    bucket in effect: its expiry cannot move before its start)."""
    org = OrganizationFactory()
    bucket = fund(org, 10 * MICRO, effective_at=timezone.now() + timedelta(days=1))
    form = {"action": "void_available", "_selected_action": [bucket.pk], "apply": "1", "reason": "typo",
            "close": "on", "key": new_form_key()}
    done = finance_client.post(reverse("admin:ledger_bucket_changelist"), form, follow=True)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.held, bucket.voided, bucket.closed_at) == (0, 0, 10 * MICRO, None)
    starts = f"{bucket.effective_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    assert _messages(done) == [
        f"Voided {10 * MICRO} micro-credits of bucket {bucket.pk}; not closed: it is not in effect until "
        f"{starts}. Nothing can be held on it before then, so the void left nothing on it to spend."
    ]


def test_voiding_an_expired_bucket_says_it_expired_and_that_returns_expire(finance_client) -> None:
    org = OrganizationFactory()
    bucket = fund(org, 10 * MICRO, expires_at=timezone.now() + timedelta(hours=1))
    place_hold(org=org, amount=3 * MICRO, key="h")
    form = {"action": "void_available", "_selected_action": [bucket.pk], "apply": "1", "reason": "late",
            "close": "on", "key": new_form_key()}
    with shifted(timedelta(hours=2)):  # expired, and the expiry sweep has not run yet
        done = finance_client.post(reverse("admin:ledger_bucket_changelist"), form, follow=True)
    bucket.refresh_from_db()
    assert (bucket.voided, bucket.closed_at) == (7 * MICRO, None)
    ended = f"{bucket.expires_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    assert _messages(done) == [
        f"Voided {7 * MICRO} micro-credits of bucket {bucket.pk}; not closed: it expired at {ended} already. "
        f"The {3 * MICRO} micro-credits still held by jobs (running or queued) may still be spent by them; "
        "what they give back will expire."
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
    (line,) = page.context["statement"]["consumption"]
    assert line["bar"] == 100 and b'class="statement-bar"' in page.content  # the largest line: a full bar
    assert b"Provisional: the figures can still change." in page.content  # the month in progress
    assert b"the month is in progress: it ends now" in page.content
    # QA: a past month said so too.
    past = finance_client.get(url, {"org": org.pk, "month": "2026-01"})
    assert past.status_code == 200 and b"it ends now" not in past.content
    csv_file = finance_client.get(url, {"org": org.pk, "month": month, "format": "csv"})
    assert csv_file["Content-Type"].startswith("text/csv")
    assert b"closing balance" in csv_file.content and str(7 * MICRO).encode() in csv_file.content
    assert b"A month as YYYY-MM" in finance_client.get(url, {"org": org.pk, "month": "11/2026"}).content
    # QA: an org without a month asked for one; it is the month in progress, as in the API.
    assert finance_client.get(url, {"org": org.pk}).context["statement"]["month"] == month
    staff = Client()
    staff.force_login(UserFactory(is_staff=True))
    assert staff.get(url).status_code == 403  # staff without finance's journal permission


def _messages(response) -> list[str]:
    """The messages the redirected-to page showed (follow=True consumes them there)."""
    return [str(m) for m in response.context["messages"]]


@pytest.mark.parametrize(("credits", "issued"), [
    ("999999999999.999999", False),  # QA's amount: ~10^18 micro-credits
    ("1000000000.000001", False),
    ("1000000000", True),  # the API's cap, 10^15 micro-credits
])
def test_issue_form_has_the_apis_amount_cap(finance_client, credits, issued) -> None:
    org = OrganizationFactory()
    response = finance_client.post(reverse("admin:ledger_bucket_issue"), _issue_form(org, credits=credits))
    assert response.status_code == (302 if issued else 200)
    assert Bucket.objects.filter(org=org).exists() is issued
    if issued:
        assert Bucket.objects.get(org=org).granted == MAX_AMOUNT
    else:
        assert "less than or equal to 1000000000" in response.content.decode()


@pytest.mark.parametrize("credits", ["1e3", "1E9", "5e-1", "+5", "-5", "1_000", "1,000", "0x10", "NaN",
                                     "Infinity", "١٢"])
def test_issue_form_takes_only_a_plain_decimal_number(finance_client, credits) -> None:
    """QA: "1e3" issued 1,000 credits; a slip like "1e9" would have issued a billion."""
    org = OrganizationFactory()
    response = finance_client.post(reverse("admin:ledger_bucket_issue"), _issue_form(org, credits=credits))
    assert response.status_code == 200
    assert response.context["form"].errors["credits"] == [
        "Enter a plain decimal number, such as 1000 or 12.5: no exponent (1e3), sign or separators."
    ]
    assert not Bucket.objects.filter(org=org).exists()


@pytest.mark.parametrize(("credits", "micro"), [
    ("1000", 1000 * MICRO), (" 12.5 ", 12_500_000), ("7.", 7 * MICRO), (".25", 250_000), ("0.000001", 1),
])
def test_issue_form_takes_plain_decimal_numbers(finance_client, credits, micro) -> None:
    org = OrganizationFactory()
    response = finance_client.post(reverse("admin:ledger_bucket_issue"), _issue_form(org, credits=credits))
    assert response.status_code == 302
    assert Bucket.objects.get(org=org).granted == micro


@pytest.mark.parametrize("effective_at", ["2025-01-01 00:00", ""])
def test_issue_form_refuses_an_expiry_in_the_past(finance_client, effective_at) -> None:
    """QA issued bucket 11 effective 2025-01-01, expiring 2025-06-01: born expired."""
    org = OrganizationFactory()
    form = _issue_form(org, effective_at=effective_at, expires_at="2025-06-01 00:00")
    response = finance_client.post(reverse("admin:ledger_bucket_issue"), form)
    assert response.status_code == 200
    assert response.context["form"].errors == {"expires_at": ["The expiry is in the past."]}  # by the field
    assert "after the effective time" not in response.content.decode()
    assert not Bucket.objects.filter(org=org).exists()


def test_reissuing_the_same_reference_says_nothing_new_was_issued(finance_client) -> None:
    org = OrganizationFactory()
    url = reverse("admin:ledger_bucket_issue")
    first = finance_client.post(url, _issue_form(org), follow=True)
    bucket = Bucket.objects.get(org=org)
    assert _messages(first) == [f"Issued bucket {bucket.pk} (12500000 micro-credits)."]
    again = finance_client.post(url, _issue_form(org), follow=True)
    assert again.redirect_chain == [(reverse("admin:ledger_bucket_change", args=[bucket.pk]), 302)]
    assert _messages(again) == [
        f"Reference 'grant-7' was already issued as bucket {bucket.pk} (12500000 micro-credits); "
        "nothing new was issued."
    ]
    assert Bucket.objects.filter(org=org).count() == 1
    assert LedgerTransaction.objects.filter(org=org).count() == 1


def test_the_same_grant_sent_again_after_its_expiry_says_it_was_issued(finance_client) -> None:
    """QA: the form refused it ("The expiry is in the past.") before the service saw the reference."""
    org = OrganizationFactory()
    url = reverse("admin:ledger_bucket_issue")
    soon = (timezone.now() + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S")
    finance_client.post(url, _issue_form(org, expires_at=soon), follow=True)
    bucket = Bucket.objects.get(org=org)
    with shifted(timedelta(hours=2)):  # its expiry has passed
        again = finance_client.post(url, _issue_form(org, expires_at=soon), follow=True)
        assert _messages(again)[0].startswith(f"Reference 'grant-7' was already issued as bucket {bucket.pk}")
        late = finance_client.post(url, _issue_form(org, reference="other", expires_at=soon))
    assert late.context["form"].errors["expires_at"] == ["The expiry is in the past."]
    assert Bucket.objects.filter(org=org).count() == 1


def test_issue_form_shows_a_form_wide_error_once(finance_client) -> None:
    org = OrganizationFactory()
    url = reverse("admin:ledger_bucket_issue")
    finance_client.post(url, _issue_form(org))
    refused = finance_client.post(url, _issue_form(org, credits="13"))  # same reference, other amount
    assert refused.status_code == 200
    assert refused.content.decode().count("was already issued with different parameters") == 1


def test_journal_and_holds_tell_a_release_to_expiry_from_one_back_to_the_org(finance_client) -> None:
    """QA: a release into an expired bucket was listed as "Release", though the org got nothing."""
    org = OrganizationFactory()
    fund(org, 3 * MICRO, expires_at=timezone.now() + timedelta(hours=1))
    fund(org, 10 * MICRO)
    gone = place_hold(org=org, amount=2 * MICRO, key="gone")  # soonest-expiring first: all expiring
    mixed = place_hold(org=org, amount=3 * MICRO, key="mixed")  # 1 expiring, 2 not
    back = place_hold(org=org, amount=MICRO, key="back")
    release_hold(hold=back)
    with shifted(timedelta(hours=2)):
        release_hold(hold=gone)
        release_hold(hold=mixed)
    journal = reverse("admin:ledger_ledgertransaction_changelist")
    releases = finance_client.get(journal + "?kind__exact=release").content.decode()
    labels = re.findall(r'<td class="field-kind_shown">([^<]*)</td>', releases)
    assert sorted(labels) == ["Release", f"Release ({MICRO} to expiry)", "Release to expiry"]
    txn = LedgerTransaction.objects.get(hold=gone, kind="release")
    detail = finance_client.get(reverse("admin:ledger_ledgertransaction_change", args=[txn.pk]))
    assert "Release to expiry" in detail.content.decode()
    holds = finance_client.get(reverse("admin:ledger_hold_changelist")).content.decode()
    to_expiry = re.findall(r'<td class="field-released_to_expiry">(\d+)</td>', holds)
    assert sorted(to_expiry, key=int) == ["0", str(MICRO), str(2 * MICRO)]


def test_a_partial_release_to_expiry_is_labelled_with_its_part() -> None:
    assert _release_label("Release", 5, 0) == "Release"
    assert _release_label("Release", 5, 3) == "Release (3 to expiry)"
    assert _release_label("Release", 5, 5) == "Release to expiry"


def test_finance_voids_part_of_one_bucket_to_correct_an_over_issue(finance_client) -> None:
    """QA: a void always took everything available, so 1,000 credits issued instead of 100 could
    only be voided whole and issued again. A part is voided from one bucket at a time."""
    org = OrganizationFactory()
    bucket = fund(org, 1000 * MICRO, effective_at=timezone.now() - timedelta(days=1))
    other = fund(org, 5 * MICRO)
    url = reverse("admin:ledger_bucket_changelist")
    both = {"action": "void_available", "_selected_action": [bucket.pk, other.pk], "apply": "1",
            "reason": "over-issue", "credits": "900", "key": new_form_key()}
    refused = finance_client.post(url, both)
    assert refused.status_code == 200
    assert refused.context["form"].errors["credits"] == ["Select one bucket to void a part of it."]
    # QA: with "close" left ticked (as offered) the rest of the bucket expired at once.
    closing = finance_client.post(url, {**both, "_selected_action": [bucket.pk], "close": "on"})
    assert "closing it would let the rest expire now" in closing.context["form"].errors["close"][0]
    bucket.refresh_from_db()
    assert (bucket.voided, bucket.expired, bucket.expires_at) == (0, 0, None)
    done = finance_client.post(url, {**both, "_selected_action": [bucket.pk]}, follow=True)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.voided, bucket.expires_at) == (100 * MICRO, 900 * MICRO, None)
    assert [str(m) for m in done.context["messages"]] == [
        f"Voided {900 * MICRO} micro-credits of bucket {bucket.pk}."]
    one = {**both, "_selected_action": [bucket.pk]}
    too_much = finance_client.post(url, {**one, "credits": "101", "key": new_form_key()}, follow=True)
    assert [str(m) for m in too_much.context["messages"]] == [
        f"Bucket {bucket.pk}: Cannot void 101.00 credits: only 100.00 are available in this bucket."]
    bucket.refresh_from_db()
    assert bucket.available == 100 * MICRO  # nothing more voided


def test_a_reference_with_a_line_break_is_refused(finance_client) -> None:
    org = OrganizationFactory()
    form = _issue_form(org, reference="inv-1\nx")
    response = finance_client.post(reverse("admin:ledger_bucket_issue"), form)
    assert response.status_code == 200
    assert "line breaks or control characters" in str(response.context["form"].non_field_errors())
    assert not Bucket.objects.filter(org=org).exists()


def _void_form(client, bucket, **fields):
    """The action's form as shown for `bucket`, filled in: its hidden key is the one it was shown with."""
    url = reverse("admin:ledger_bucket_changelist")
    ask = client.post(url, {"action": "void_available", "_selected_action": [bucket.pk]})
    return {"action": "void_available", "_selected_action": [bucket.pk], "apply": "1",
            "key": ask.context["form"]["key"].value(), **fields}


def test_the_same_void_form_submitted_twice_voids_a_part_once(finance_client) -> None:
    """QA: a double click on "Void" with 1 credit voided 2 (the key was made anew on every POST)."""
    org = OrganizationFactory()
    bucket = fund(org, 7 * MICRO, effective_at=timezone.now() - timedelta(days=1))
    url = reverse("admin:ledger_bucket_changelist")
    form = _void_form(finance_client, bucket, reason="over-issue", credits="1")
    first = finance_client.post(url, form, follow=True)
    second = finance_client.post(url, form, follow=True)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.voided) == (6 * MICRO, 1 * MICRO)
    assert LedgerTransaction.objects.filter(kind="void", org=org).count() == 1
    assert _messages(first) == [f"Voided {MICRO} micro-credits of bucket {bucket.pk}."]
    assert _messages(second) == [
        f"Voided {MICRO} micro-credits of bucket {bucket.pk} (already done: nothing new)."]
    # The same form sent back with another amount: a conflict, said plainly; nothing more voided.
    edited = finance_client.post(url, {**form, "credits": "2"}, follow=True)
    assert _messages(edited) == [
        f"Bucket {bucket.pk}: This void was done already: it voided 1.00 credits of bucket {bucket.pk}. "
        "The same key with other terms (2.00 credits) voids nothing more. Open the action again for "
        "another void."]
    bucket.refresh_from_db()
    assert bucket.voided == 1 * MICRO
    # A new form (the action chosen again) voids again.
    finance_client.post(url, _void_form(finance_client, bucket, reason="more", credits="2"))
    bucket.refresh_from_db()
    assert (bucket.available, bucket.voided) == (4 * MICRO, 3 * MICRO)


def test_the_same_void_everything_form_sent_again_does_not_void_what_came_back(finance_client) -> None:
    """Without an amount nor closing, a second submit would have voided what a job released in
    between; with the form's key it answers with the first void."""
    org = OrganizationFactory()
    bucket = fund(org, 10 * MICRO, effective_at=timezone.now() - timedelta(days=1))
    hold = place_hold(org=org, amount=3 * MICRO, key="h")
    url = reverse("admin:ledger_bucket_changelist")
    form = _void_form(finance_client, bucket, reason="chargeback")
    finance_client.post(url, form, follow=True)
    release_hold(hold=hold)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.voided) == (3 * MICRO, 7 * MICRO)
    again = finance_client.post(url, form, follow=True)
    bucket.refresh_from_db()
    assert (bucket.available, bucket.voided) == (3 * MICRO, 7 * MICRO)
    assert _messages(again) == [
        f"Voided {7 * MICRO} micro-credits of bucket {bucket.pk} (already done: nothing new)."]


@pytest.mark.parametrize("key", ["", "x" * 32, "0123456789abcdef0123456789abcdef:1",
                                 "ABCDEF0123456789ABCDEF0123456789"])
def test_a_void_form_with_a_key_it_was_not_given_voids_nothing(finance_client, key) -> None:
    """The key is joined into the ledger key (`void:admin:<key>:<bucket>`): only the shape the form
    makes is taken, so a crafted one cannot meet another bucket's or another write's key."""
    org = OrganizationFactory()
    bucket = fund(org, 7 * MICRO)
    form = {**_void_form(finance_client, bucket, reason="x", credits="1"), "key": key}
    response = finance_client.post(reverse("admin:ledger_bucket_changelist"), form)
    assert response.status_code == 200 and "key" in response.context["form"].errors
    bucket.refresh_from_db()
    assert bucket.voided == 0
