"""Balance and dashboard pages: login, tenancy (404 for other orgs), numbers equal the selector."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from accounts.models import Project
from ledger.clock import ledger_now, shifted
from ledger.models import MICRO, BucketKind
from ledger.selectors import balance_breakdown
from ledger.services import expire_due_buckets, place_hold, void_credits
from portal.templatetags.portal_money import credits
from scheduling.models import Job, JobState, Quota
from tests.factories import fund
from tests.portal.conftest import World

pytestmark = pytest.mark.django_db
# Every kind and bucket row shows these, in this order; the first five add up to the last.
ROW_COLUMNS = ("available", "held", "spent", "expired", "voided", "granted")


def _client(user: object) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _panel_html(html: str, key: str) -> str:
    start = html.index(f'data-panel="{key}"')
    end = html.find("data-panel=", start + 1)
    return html[start : end if end != -1 else len(html)]


def _field(panel: str, name: str) -> str:
    match = re.search(rf'data-field="{name}">([^<]*)<', panel)
    assert match, name
    return match.group(1)


def _kind_row(panel: str, kind: str) -> list[str]:
    row = re.search(rf'<tr data-kind="{kind}">(.*?)</tr>', panel, re.S)
    assert row, kind
    return re.findall(r'<td class="num">([^<]*)</td>', row.group(1))


def _bucket_row(panel: str, bucket_id: int) -> list[str]:
    row = re.search(rf'<tr data-bucket="{bucket_id}">(.*?)</tr>', panel, re.S)
    assert row, bucket_id
    return re.findall(r'<td class="num">([^<]*)</td>', row.group(1))


def _bucket_cell(panel: str, bucket_id: int, name: str) -> str:
    row = re.search(rf'<tr data-bucket="{bucket_id}">(.*?)</tr>', panel, re.S)
    assert row, bucket_id
    cell = re.search(rf'<(td|span)[^>]* data-field="{name}"[^>]*>(.*?)</\1>', row.group(1), re.S)
    assert cell, (bucket_id, name)
    return re.sub(r"<[^>]+>", "", cell.group(2)).strip()


def _bucket_row_html(panel: str, bucket_id: int) -> str:
    row = re.search(rf'<tr data-bucket="{bucket_id}">(.*?)</tr>', panel, re.S)
    assert row, bucket_id
    return row.group(1)


def _micro(text: str) -> int:
    """The page's credits back to micro-credits (exact: `credits` never rounds)."""
    whole, _, frac = text.replace(",", "").partition(".")
    return int(whole) * MICRO + int(frac.ljust(6, "0"))


@pytest.mark.parametrize("name", ["portal:home", "portal:dashboard"])
def test_pages_require_login(client: Client, name: str) -> None:
    response = client.get(reverse(name))
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={reverse(name)}"


def test_login_page_signs_in(client: Client, world: World) -> None:
    response = client.post(reverse("portal:login"), {"username": "alice", "password": "pw"})
    assert (response.status_code, response["Location"]) == (302, "/")
    assert client.get("/").status_code == 200


@pytest.mark.parametrize("key", ["org-acme", "project-acme-vision"])
def test_numbers_on_the_page_match_the_selector(world: World, key: str) -> None:
    html = _client(world.alice).get("/").content.decode()
    project = world.vision if key.startswith("project") else None
    expected = balance_breakdown(org=world.acme, project=project)
    panel = _panel_html(html, key)
    for name in ("available", "held", "spent"):
        assert _field(panel, name) == credits(expected["totals"][name])
    assert _field(panel, "expiring_7d") == credits(expected["expiring"]["7d"])
    assert _field(panel, "expiring_30d") == credits(expected["expiring"]["30d"])
    assert _field(panel, "spendable") == credits(expected["totals"]["spendable"])
    for kind in ("paid", "promotional"):
        assert _kind_row(panel, kind) == [credits(expected[kind][name]) for name in ROW_COLUMNS]
    assert {int(i) for i in re.findall(r'data-bucket="(\d+)"', panel)} == {
        row["id"] for row in expected["buckets"]
    }
    for row in expected["buckets"]:
        assert _bucket_row(panel, row["id"]) == [credits(row[name]) for name in ROW_COLUMNS]


def test_fixture_figures_are_the_ones_we_expect(world: World) -> None:
    # Guards the comparison above against comparing two wrong numbers: paid 1,000 + ops 300,
    # promotional 50 (expires in 5 days) + 20.5 (in 20 days); a hold of 80 with 12.345678 captured.
    panel = _panel_html(_client(world.alice).get("/").content.decode(), "org-acme")
    assert _field(panel, "available") == "1,290.50"
    assert _field(panel, "held") == "67.654322"
    assert _field(panel, "spent") == "12.345678"
    assert _field(panel, "expiring_7d") == "37.654322"
    assert _field(panel, "expiring_30d") == "58.154322"
    vision = _panel_html(_client(world.alice).get("/").content.decode(), "project-acme-vision")
    assert _field(vision, "available") == "990.50"  # the ops-only bucket is not vision's


def test_a_user_sees_only_their_orgs(world: World) -> None:
    alice = _client(world.alice)
    html = alice.get("/").content.decode()
    assert 'id="org-acme"' in html and "Globex" not in html
    assert alice.get(reverse("portal:org", args=["globex"])).status_code == 404
    assert alice.get(reverse("portal:org", args=["nope"])).status_code == 404
    assert alice.get(reverse("portal:org", args=["acme"])).status_code == 200
    assert _client(world.bob).get(reverse("portal:org", args=["acme"])).status_code == 404


def test_a_project_member_sees_only_their_project(world: World) -> None:
    html = _client(world.dave).get(reverse("portal:org", args=["acme"])).content.decode()
    assert 'data-panel="project-acme-vision"' in html
    assert 'data-panel="org-acme"' not in html
    assert "project-acme-ops" not in html


def test_jobs_show_state_and_why_they_wait(world: World) -> None:
    world.job.state, world.job.wait_reason = "queued", "quota_exceeded"
    world.job.wait_detail = "org quota of 2 H100 in use"
    world.job.save()
    html = _client(world.alice).get("/").content.decode()
    row = re.search(rf'<tr data-job="{world.job.id}">(.*?)</tr>', html, re.S)
    assert row
    assert "Queued" in row.group(1)
    assert "<code>quota_exceeded</code> org quota of 2 H100 in use" in row.group(1)
    assert "expected to start" not in row.group(1)  # no reservation
    world.job.expected_start_at = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
    world.job.save()
    html = _client(world.alice).get("/").content.decode()
    row = re.search(rf'<tr data-job="{world.job.id}">(.*?)</tr>', html, re.S)
    assert row and "expected to start by 2026-12-01 09:30:00 UTC" in row.group(1)


def test_a_queued_job_shows_where_it_stands_in_the_queue(world: World) -> None:
    ahead = Job.objects.create(  # same class, submitted earlier: considered first
        org=world.acme, project=world.vision, user=world.dave, name="ahead", gpu_types=["H100"], gpu_count=1,
        max_wall_seconds=3600, priority_class=world.job.priority_class, state=JobState.QUEUED,
        submitted_at=world.job.submitted_at - timedelta(hours=5),
    )
    world.job.state = JobState.QUEUED
    world.job.save()
    html = _client(world.alice).get("/").content.decode()
    row = re.search(rf'<tr data-job="{world.job.id}">(.*?)</tr>', html, re.S)
    assert row and "#2 of 2 in the queue" in row.group(1)
    ahead.state = JobState.CANCELLED
    ahead.save()
    html = _client(world.alice).get("/").content.decode()
    assert "#1 of 1 in the queue" in html


@pytest.mark.parametrize(("who", "status"), [("alice", 403), ("dave", 403), ("bob", 200), ("carol", 200)])
def test_dashboard_is_for_finance_and_org_admins(world: World, who: str, status: int) -> None:
    response = _client(getattr(world, who)).get(reverse("portal:dashboard"))
    assert response.status_code == status


def test_dashboard_page_embeds_a_scoped_snapshot(world: World) -> None:
    bob_html = _client(world.bob).get(reverse("portal:dashboard")).content.decode()
    carol_html = _client(world.carol).get(reverse("portal:dashboard")).content.decode()
    assert "train-resnet" in carol_html and "train-resnet" not in bob_html


def test_logout_signs_out(world: World) -> None:
    client = _client(world.alice)
    response = client.post(reverse("portal:logout"))
    assert response.status_code == 302
    assert client.get("/").status_code == 302


def test_home_page_query_count_does_not_grow_with_buckets(
    world: World, django_assert_max_num_queries: object
) -> None:
    # 20: each of alice's two project panels (vision, ops) adds one sum of its own holds; the
    # org's budgets are one read (none are set: no period to read, no role to check); her jobs
    # are those of projects she sees, which asks once whether she is finance.
    client = _client(world.alice)
    with django_assert_max_num_queries(20):  # type: ignore[operator]
        assert client.get("/").status_code == 200
    for _ in range(10):
        fund(world.acme, 1_000_000)
    with django_assert_max_num_queries(20):  # type: ignore[operator]
        assert client.get("/").status_code == 200


def test_every_kind_and_bucket_row_adds_up_to_granted(world: World) -> None:
    """QA: the rows lacked Voided (and the bucket table Expired), so they did not add up."""
    in_9_days = ledger_now() + timedelta(days=9)
    voided = fund(world.acme, 40 * MICRO, kind=BucketKind.PROMOTIONAL, expires_at=in_9_days)
    void_credits(bucket=voided, reason="refund", key="portal-void", amount=15 * MICRO)
    with shifted(timedelta(days=10)):  # the 5-day promo and the 9-day one expire
        expire_due_buckets()
        html = _client(world.alice).get(reverse("portal:org", args=["acme"])).content.decode()
    rows_checked = 0
    for key in ("org-acme", "project-acme-vision"):
        panel = _panel_html(html, key)
        rows = [_kind_row(panel, kind) for kind in ("paid", "promotional")]
        rows += [_bucket_row(panel, int(i)) for i in re.findall(r'data-bucket="(\d+)"', panel)]
        for cells in rows:
            assert len(cells) == len(ROW_COLUMNS)
            *parts, granted = (_micro(cell) for cell in cells)
            assert sum(parts) == granted and granted > 0, cells
            rows_checked += 1
    org = _panel_html(html, "org-acme")
    assert _bucket_row(org, voided.pk)[3:] == ["25.00", "15.00", "40.00"]  # expired, voided, granted
    assert _kind_row(org, "promotional")[4] == "15.00"
    assert rows_checked == 2 + 5 + 2 + 4  # kinds and buckets of both panels: none skipped


def test_spendable_now_and_what_limits_a_bucket(world: World) -> None:
    """QA: Available counted credits that cannot be spent now (a bucket not yet in effect, one
    for some GPU types only) with nothing on the page saying so."""
    start = ledger_now() + timedelta(days=3)
    later = fund(world.acme, 100 * MICRO, effective_at=start)
    h100_only = fund(world.acme, 30 * MICRO, gpu_types=("H100",))
    html = _client(world.alice).get("/").content.decode()
    panel = _panel_html(html, "org-acme")
    expected = balance_breakdown(org=world.acme)["totals"]
    assert expected["available"] - expected["spendable"] == 100 * MICRO
    assert _field(panel, "available") == credits(expected["available"])
    assert _field(panel, "spendable") == credits(expected["spendable"])
    assert _field(panel, "spendable_gpu_limited") == "30.00"
    assert _bucket_cell(panel, h100_only.pk, "gpu_types") == "H100 only"
    assert _bucket_cell(panel, world.paid.pk, "gpu_types") == "any"
    assert _bucket_cell(panel, later.pk, "effective_at") == f"from {start:%Y-%m-%d %H:%M} UTC"
    assert 'data-field="effective_at"' not in _bucket_row_html(panel, h100_only.pk)


def test_a_project_panel_shows_its_own_jobs_apart_from_the_shared_buckets(world: World) -> None:
    """QA: the vision panel's Held counted another project's job on the org-wide bucket."""
    ops = world.acme.projects.get(slug="ops")
    place_hold(org=world.acme, amount=7 * MICRO, key="ops-hold", project=ops)
    html = _client(world.alice).get("/").content.decode()
    vision = _panel_html(html, "project-acme-vision")
    shared = balance_breakdown(org=world.acme, project=world.vision)["totals"]
    # The fixture's vision hold: 80, 12.345678 of it captured. The ops hold is drawn from the
    # org-wide paid bucket (it expires; ops's own bucket does not, so it is spent last).
    assert _field(vision, "held") == credits(shared["held"]) == "74.654322"
    assert _field(vision, "project_held") == "67.654322"
    assert _field(vision, "project_spent") == "12.345678"
    assert "all projects" in vision
    org = _panel_html(html, "org-acme")
    assert 'data-field="project_held"' not in org and "all projects" not in org


def test_org_members_download_the_months_statement_from_the_page(world: World) -> None:
    alice = _client(world.alice)
    link = f'href="/api/v1/orgs/{world.acme.pk}/statement?format=csv"'
    assert link in alice.get("/").content.decode()
    response = alice.get(f"/api/v1/orgs/{world.acme.pk}/statement?format=csv")  # the browser's session
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert b"closing balance" in response.content
    # A project-only member reads no org-wide money: no link, and the route says 403.
    assert "statement?format=csv" not in _client(world.dave).get("/").content.decode()
    assert _client(world.dave).get(f"/api/v1/orgs/{world.acme.pk}/statement").status_code == 403


def _quota_row(html: str, key: str) -> dict[str, str]:
    start = html.index(f'data-quota="{key}"')
    row = html[start : html.index("</tr>", start)]
    return {name: _field(row, name) for name in ("in_use", "max", "available", "queued_jobs", "queued_gpus")}


def test_the_org_page_shows_quotas_with_their_use(world: World) -> None:
    ops = Project.objects.get(slug="ops")
    Quota.objects.create(org=world.acme, gpu_type=world.h100, max_gpus=8)
    Quota.objects.create(org=world.acme, project=world.vision, gpu_type=world.h100, max_gpus=2)
    Quota.objects.create(org=world.acme, project=ops, gpu_type=world.h100, max_gpus=4)
    waiting = Job.objects.get(pk=world.job.pk)
    waiting.pk, waiting.state, waiting.gpu_count = None, JobState.QUEUED, 4
    waiting.save()  # a second vision job, queued, asking for 4 H100s

    html = _client(world.alice).get(reverse("portal:org", args=["acme"])).content.decode()
    # The fixture's running vision job holds 2 H100s.
    assert _quota_row(html, "org-H100") == {
        "in_use": "2", "max": "8", "available": "6", "queued_jobs": "1", "queued_gpus": "4"}
    assert _quota_row(html, "vision-H100") == {
        "in_use": "2", "max": "2", "available": "0", "queued_jobs": "1", "queued_gpus": "4"}
    assert _quota_row(html, "ops-H100")["in_use"] == "0"
    # Dave belongs to the vision project only: not the ops project's quota.
    html = _client(world.dave).get(reverse("portal:org", args=["acme"])).content.decode()
    assert 'data-quota="vision-H100"' in html and 'data-quota="org-H100"' in html
    assert 'data-quota="ops-H100"' not in html


def test_an_org_without_quotas_shows_no_quota_table(world: World) -> None:
    html = _client(world.alice).get(reverse("portal:org", args=["acme"])).content.decode()
    assert 'id="quotas"' not in html


def test_a_bucket_finance_closed_says_so(world: World) -> None:
    """QA: a closed bucket showed only as "expired", the same as one that ran out its time."""
    hour_ago = ledger_now() - timedelta(hours=1)
    bucket = fund(world.acme, 10 * MICRO, kind=BucketKind.PROMOTIONAL, effective_at=hour_ago)
    void_credits(bucket=bucket, reason="fraud", key="portal-close", close=True)
    bucket.refresh_from_db()
    assert bucket.closed_at is not None
    html = _client(world.alice).get(reverse("portal:org", args=["acme"])).content.decode()
    row = _bucket_row_html(_panel_html(html, "org-acme"), bucket.pk)
    assert "closed by finance" in row
    assert "closed by finance" not in _bucket_row_html(_panel_html(html, "org-acme"), world.paid.pk)


def test_a_user_in_no_org_is_told_who_can_add_them() -> None:
    """QA: the page said "Ask an organization owner to add you", which no owner can do: the API adds
    to projects only people already in the org; a first membership is given by staff in the admin."""
    from tests.factories import UserFactory

    html = _client(UserFactory()).get("/").content.decode()
    assert "Ask an organization owner" not in html
    assert "platform's administrators" in html


def test_a_user_removed_from_the_org_no_longer_sees_its_jobs_on_the_home_page(world: World) -> None:
    """Review: the home page listed every job the user had ever submitted (its name, state, wait
    reason, place in the queue, end), also after they left the job's org, while the job's page and
    `GET /api/v1/jobs` answered 404 / nothing for it: the list shows the jobs of projects they see."""
    from accounts.models import Membership, OrgMembership

    client = _client(world.alice)
    assert f'data-job="{world.job.id}"' in client.get("/").content.decode()
    OrgMembership.objects.filter(user=world.alice).delete()
    Membership.objects.filter(user=world.alice).delete()
    html = client.get("/").content.decode()
    assert f'data-job="{world.job.id}"' not in html and "train-resnet" not in html
    assert client.get(reverse("portal:job", args=[world.job.pk])).status_code == 404
