"""Balance and dashboard pages: login, tenancy (404 for other orgs), numbers equal the selector."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse

from ledger.selectors import balance_breakdown
from portal.templatetags.portal_money import credits
from scheduling.models import Job, JobState
from tests.portal.conftest import World

pytestmark = pytest.mark.django_db


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
    for kind in ("paid", "promotional"):
        assert _kind_row(panel, kind) == [
            credits(expected[kind][name]) for name in ("available", "held", "spent", "expired")
        ]
    assert {int(i) for i in re.findall(r'data-bucket="(\d+)"', panel)} == {
        row["id"] for row in expected["buckets"]
    }


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
    from tests.factories import fund

    client = _client(world.alice)
    with django_assert_max_num_queries(16):  # type: ignore[operator]
        assert client.get("/").status_code == 200
    for _ in range(10):
        fund(world.acme, 1_000_000)
    with django_assert_max_num_queries(16):  # type: ignore[operator]
        assert client.get("/").status_code == 200
