"""Admin actions that change a node are for staff who may change nodes: one who may only view the
node list (a support role, an auditor) neither drains a node, takes it out of service, returns it,
nor mints its agent token (review: those actions had no `permissions`, and Django offers such an
action to anyone who may open the change list; a view-only user got a working node token, and with
it the power to report any usage for that node's attempts)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse

from scheduling.models import JobState, Node, NodeCordon
from scheduling.services.nodes import authenticate_node
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:scheduling_node_changelist"
NODE_ACTIONS = {"issue_token", "drain", "take_out_of_service", "return_to_service"}


def _staff(client: Client, *codenames: str) -> Any:
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="scheduling",
                                                         codename__in=codenames))
    client.force_login(user)
    return user


def _actions(client: Client) -> set[str]:
    form = client.get(reverse(CHANGELIST)).context["action_form"]  # None: no action at all
    if form is None:
        return set()
    return {name for name, _label in form.fields["action"].choices if name}


def test_a_view_only_user_is_offered_no_node_action_and_cannot_run_one(
    client: Client, fleet: dict[str, Any],
) -> None:
    node = fleet["node"]
    before = Node.objects.get(pk=node.pk)
    _staff(client, "view_node")
    assert _actions(client) & NODE_ACTIONS == set()
    for action in sorted(NODE_ACTIONS):
        response = client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [node.pk]},
                               follow=True)
        assert response.status_code == 200
        assert not any("Token for" in str(m) for m in response.context["messages"]), action
    after = Node.objects.get(pk=node.pk)
    assert (after.token_prefix, after.token_hash, after.cordon) == (
        before.token_prefix, before.token_hash, before.cordon)


def test_a_user_who_may_change_nodes_keeps_the_actions(client: Client, fleet: dict[str, Any]) -> None:
    node = fleet["node"]
    _staff(client, "view_node", "change_node")
    assert _actions(client) >= NODE_ACTIONS
    client.post(reverse(CHANGELIST), {"action": "drain", "_selected_action": [node.pk]})
    assert Node.objects.get(pk=node.pk).cordon == NodeCordon.DRAIN
    response = client.post(reverse(CHANGELIST), {"action": "issue_token", "_selected_action": [node.pk]},
                           follow=True)
    (message,) = [str(m) for m in response.context["messages"] if "Token for" in str(m)]
    assert authenticate_node(message.rsplit(": ", 1)[1]).pk == node.pk


JOB_CHANGELIST = "admin:scheduling_job_changelist"
JOB_ACTIONS = {"cancel", "hold", "release"}


def _job_actions(client: Client) -> set[str]:
    form = client.get(reverse(JOB_CHANGELIST)).context["action_form"]
    return set() if form is None else {name for name, _label in form.fields["action"].choices if name}


def test_a_user_who_may_only_view_jobs_cannot_cancel_hold_or_release_them(
    client: Client, fleet: dict[str, Any], make_job: Any,
) -> None:
    """Review: the job actions needed only `view_job`; a read-only staff user cancelled a job."""
    job = make_job(JobState.QUEUED, hold=False)
    _staff(client, "view_job")
    assert _job_actions(client) & JOB_ACTIONS == set()
    for action in sorted(JOB_ACTIONS):
        client.post(reverse(JOB_CHANGELIST), {"action": action, "_selected_action": [job.pk]}, follow=True)
    job.refresh_from_db()
    assert (job.state, job.held) == (JobState.QUEUED, False)


def test_a_user_who_may_operate_jobs_cancels_one(
    client: Client, fleet: dict[str, Any], make_job: Any,
) -> None:
    job = make_job(JobState.QUEUED, hold=False)
    _staff(client, "view_job", "operate_job")
    assert _job_actions(client) >= JOB_ACTIONS
    client.post(reverse(JOB_CHANGELIST), {"action": "cancel", "_selected_action": [job.pk]}, follow=True)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_the_migration_gives_operate_job_to_fleet_operators_only() -> None:
    """Staff who view jobs and change nodes (users or groups) keep the job actions; read-only
    staff do not get them."""
    from importlib import import_module

    from django.apps import apps
    from django.contrib.auth.models import Group

    def perms(*codenames: str) -> list[Permission]:
        return list(Permission.objects.filter(content_type__app_label="scheduling", codename__in=codenames))

    operate = perms("operate_job")[0]
    operator, reader = UserFactory(is_staff=True), UserFactory(is_staff=True)
    operator.user_permissions.add(*perms("view_job", "change_node"))
    reader.user_permissions.add(*perms("view_job"))
    ops, readers = Group.objects.create(name="ops"), Group.objects.create(name="readers")
    ops.permissions.add(*perms("view_job", "change_node"))
    readers.permissions.add(*perms("view_job", "view_node"))
    import_module("scheduling.migrations.0034_job_operate_permission").forwards(apps, None)
    assert operate in operator.user_permissions.all() and operate in ops.permissions.all()
    assert operate not in reader.user_permissions.all() and operate not in readers.permissions.all()
