"""The job page: what the API's GET /jobs/{id} shows, in the browser (QA: the portal listed jobs
but had no page for one: attempts, nodes, what each was charged, refunds, why it waits)."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import reverse

from ledger.models import MICRO
from portal.templatetags.portal_money import credits, span
from scheduling.models import Job, JobState
from scheduling.services.refunds import refund_job
from tests.api.conftest import client_for
from tests.portal.conftest import World

pytestmark = pytest.mark.django_db
CAPTURED = 12_345_678  # the world's running job: 12.345678 credits captured at 4 credits / GPU-hour


def _get(user: object, job_id: int) -> tuple[int, str]:
    client = Client()
    client.force_login(user)
    response = client.get(reverse("portal:job", args=[job_id]))
    return response.status_code, response.content.decode()


def _field(html: str, name: str) -> str:
    match = re.search(rf'data-field="{name}">(.*?)</', html, re.S)
    assert match, name
    return match.group(1).strip()


def test_the_page_shows_the_figures_the_api_gives(world: World) -> None:
    status, html = _get(world.alice, world.job.pk)
    assert status == 200
    api = client_for(world.alice).get(f"/api/v1/jobs/{world.job.pk}").json()
    assert api["attempts"][0]["charged"] == CAPTURED
    assert _field(html, "charged") == credits(CAPTURED) and _field(html, "refunded") == credits(0)
    assert _field(html, "net") == credits(CAPTURED)
    attempt = re.search(r'<tr data-attempt="1">(.*?)</tr>', html, re.S).group(1)
    assert _field(attempt, "gpu_hours") == "3.086"  # 12.345678 / 4 per GPU-hour
    assert "node-a1" in attempt and "2 \u00d7 H100" in attempt
    assert "2 \u00d7 H100" in _field(html, "gpus")
    hold = _field(html, "hold")
    assert credits(80 * MICRO) in hold and credits(80 * MICRO - CAPTURED) + " still held" in hold


def test_a_refund_shows_and_the_net_cost_drops(world: World) -> None:
    refund_job(job_id=world.job.pk, amount=2 * MICRO, reason="bad node", key="r1")
    _, html = _get(world.alice, world.job.pk)
    assert _field(html, "refunded") == credits(2 * MICRO)
    assert _field(html, "net") == credits(CAPTURED - 2 * MICRO)


def test_who_sees_the_page(world: World) -> None:
    assert _get(world.dave, world.job.pk)[0] == 200  # a member of the job's project
    assert _get(world.bob, world.job.pk)[0] == 404  # another org's owner
    assert _get(world.alice, 10**12)[0] == 404
    anonymous = Client().get(reverse("portal:job", args=[world.job.pk]))
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]


def test_a_queued_job_says_why_it_waits_and_the_list_links_to_it(world: World) -> None:
    Job.objects.filter(pk=world.job.pk).update(
        state=JobState.QUEUED, wait_reason="resources", wait_detail="no node with 2 free H100")
    _, html = _get(world.alice, world.job.pk)
    waiting = re.search(r'data-field="waiting">(.*?)</div>', html, re.S).group(1)
    assert "<code>resources</code> no node with 2 free H100" in waiting
    home = Client()
    home.force_login(world.alice)
    assert f'href="/jobs/{world.job.pk}/"' in home.get("/").content.decode()


def test_durations_read_as_people_say_them() -> None:
    assert (span(93_784), span(61), span(0), span(3_600), span(None)) == (
        "1 d 2 h 3 min", "1 min 1 s", "0 s", "1 h", "—")
