"""Scheduling admin: every page renders; the node-token action shows the token once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from scheduling.models import Job, JobState, Node
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

PAGES = ["gputype", "gpuprice", "node", "priorityclass", "quota", "job", "jobattempt", "allocation",
         "schedulerpass"]


@pytest.fixture
def staff(client: Client) -> Client:
    user = UserFactory(is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


@pytest.mark.parametrize("model", PAGES)
def test_changelists_render(staff: Client, fleet: dict[str, Any], make_job: Callable[..., Job],
                            model: str) -> None:
    job = make_job(JobState.QUEUED, wait_reason="resources")
    assert staff.get(reverse(f"admin:scheduling_{model}_changelist")).status_code == 200
    if model == "job":
        page = staff.get(reverse("admin:scheduling_job_change", args=[job.pk]))
        assert page.status_code == 200 and b"resources" in page.content


def test_issue_token_action(staff: Client, fleet: dict[str, Any]) -> None:
    node = fleet["node"]
    response = staff.post(reverse("admin:scheduling_node_changelist"),
                          {"action": "issue_token", "_selected_action": [node.pk]}, follow=True)
    assert response.status_code == 200
    node = Node.objects.get(pk=node.pk)
    assert node.token_prefix and node.token_prefix.encode() in response.content


def test_cancel_action_cancels_a_queued_job(staff: Client, fleet: dict[str, Any],
                                            make_job: Callable[..., Job]) -> None:
    job = make_job(JobState.QUEUED, hold=False)
    staff.post(reverse("admin:scheduling_job_changelist"),
               {"action": "cancel", "_selected_action": [job.pk]}, follow=True)
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
