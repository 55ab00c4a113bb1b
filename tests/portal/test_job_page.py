"""The job page: what the API's GET /jobs/{id} shows, in the browser (QA: the portal listed jobs
but had no page for one: attempts, nodes, what each was charged, refunds, why it waits)."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import MICRO
from ledger.services import capture, place_hold, release_hold
from portal.templatetags.portal_money import credits, span
from scheduling.models import Allocation, AttemptState, Job, JobAttempt, JobState, Node, NodeState
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


SECOND = 5_500_000  # what a second attempt's own hold captured


def _another_attempt(world: World, number: int, captured: int) -> JobAttempt:
    """Attempt `number` of the world's job on a hold of its own (the job's current one now), as a
    retry after a lost node makes it: the attempt before it ended and its hold was released."""
    before = JobAttempt.objects.get(job=world.job, number=number - 1)
    JobAttempt.objects.filter(pk=before.pk).update(state=AttemptState.ENDED, ended_at=timezone.now(),
                                                   outcome="lost")
    release_hold(hold=before.hold)
    hold = place_hold(org=world.acme, amount=40 * MICRO, key=f"portal-hold-{number}", project=world.vision,
                      user=world.alice)
    capture(hold=hold, amount=captured, key=f"portal-capture-{number}")
    attempt = JobAttempt.objects.create(
        job=world.job, number=number, org_id=world.acme.pk, state=AttemptState.RUNNING, gpu_type=world.h100,
        gpu_count=2, rate_per_gpu_hour=4 * MICRO, hold=hold, scheduled_at=timezone.now(),
        started_at=timezone.now())
    node = Node.objects.create(name=f"node-b{number}", region=before.allocations.first().node.region,
                               gpu_type=world.h100, gpu_count=8, state=NodeState.READY)
    Allocation.objects.create(attempt=attempt, node=node, gpu_index=0, allocated_at=timezone.now())
    Job.objects.filter(pk=world.job.pk).update(current_hold=hold)
    return attempt


def test_a_retried_job_shows_the_figures_the_api_gives(world: World) -> None:
    """Review: the test above has one attempt, so Charged taken from the current hold alone passed
    it. Two attempts on holds of their own, the first's refunded in part: page and API agree."""
    _another_attempt(world, 2, SECOND)
    refund_job(job_id=world.job.pk, amount=2 * MICRO, reason="lost node", key="r1", attempt_number=1)
    _, html = _get(world.alice, world.job.pk)
    api = client_for(world.alice).get(f"/api/v1/jobs/{world.job.pk}").json()
    charged = sum(attempt["charged"] for attempt in api["attempts"])
    assert charged == CAPTURED + SECOND and api["refunded"] == 2 * MICRO
    assert _field(html, "charged") == credits(charged)
    assert _field(html, "refunded") == credits(api["refunded"])
    assert _field(html, "net") == credits(charged - api["refunded"])
    assert len(api["attempts"]) == 2
    for attempt in api["attempts"]:
        row = re.search(rf'<tr data-attempt="{attempt["number"]}">(.*?)</tr>', html, re.S).group(1)
        assert _field(row, "charged") == credits(attempt["charged"])
    hold = _field(html, "hold")  # the current hold: the second attempt's
    assert credits(40 * MICRO) in hold and credits(40 * MICRO - SECOND) + " still held" in hold


def test_the_page_reads_a_job_in_a_fixed_number_of_queries(world: World) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert _get(world.alice, world.job.pk)[0] == 200
        return len(captured)

    before = queries()
    _another_attempt(world, 2, SECOND)
    _another_attempt(world, 3, MICRO)
    html = _get(world.alice, world.job.pk)[1]
    assert 'data-attempt="3"' in html and "node-b3" in html
    assert queries() == before


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


def test_a_rate_of_0_bills_no_gpu_hours_it_can_tell(world: World) -> None:
    """Review: a free attempt showed 0.000 GPU-hours billed, as if it had not run."""
    JobAttempt.objects.filter(job=world.job).update(rate_per_gpu_hour=0)
    _, html = _get(world.alice, world.job.pk)
    attempt = re.search(r'<tr data-attempt="1">(.*?)</tr>', html, re.S).group(1)
    assert re.search(r'data-field="gpu_hours">(.*?)</td>', attempt, re.S).group(1).endswith(">—</span>")


def test_durations_read_as_people_say_them() -> None:
    assert (span(93_784), span(61), span(0), span(3_600), span(None)) == (
        "1 d 2 h 3 min", "1 min 1 s", "0 s", "1 h", "—")
