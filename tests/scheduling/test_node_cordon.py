"""An operator's cordon (drain, out of service) is kept apart from a node's health: heartbeats never
undo it, and taking a node out of service stops its jobs with a grace and requeues them without
counting a retry (QA, session 9: a drain was lost after a silence, and an admin "down" ended jobs
as lost, used up a retry, then flipped back to ready at the next heartbeat)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from importlib import import_module
from typing import Any

import pytest
from django.apps import apps
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEvent
from config import metrics
from config.clock import db_now
from ledger.services import place_hold
from metering.heartbeats import ingest_heartbeats
from scheduling import core
from scheduling.adapter.snapshot import load_snapshot
from scheduling.adapter.writer import apply_result
from scheduling.models import (
    Allocation,
    AttemptState,
    Job,
    JobAttempt,
    JobState,
    Node,
    NodeCordon,
    NodeState,
)
from scheduling.services.lifecycle import finish_attempt
from scheduling.services.nodes import set_cordon
from scheduling.services.tick import run_scheduling_pass, sweep_nodes
from tests.factories import UserFactory, fund

pytestmark = pytest.mark.django_db


def _running_on(node: Node, tenant: dict[str, Any], make_job: Callable[..., Job],
                make_attempt: Callable[..., JobAttempt]) -> tuple[Job, JobAttempt]:
    fund(tenant["org"], 100_000_000)
    hold = place_hold(org=tenant["org"], amount=3_000_000, key=f"cordon-{node.pk}", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    job = make_job(JobState.RUNNING, current_hold=hold, gpu_types=["H100"], gpu_count=1)
    attempt = make_attempt(job, AttemptState.RUNNING, gpu_count=1, started_at=timezone.now())
    Allocation.objects.create(attempt=attempt, node=node, gpu_index=0, allocated_at=attempt.scheduled_at)
    return job, attempt


def _core_state(node: Node) -> str:
    return next(n.state for n in load_snapshot(now=timezone.now()).snapshot.nodes if n.id == node.pk)


def test_a_drain_survives_the_node_going_silent_and_coming_back(fleet: dict[str, Any], settings: Any) -> None:
    settings.METERING_NODE_UNKNOWN_AFTER_S, settings.METERING_NODE_DOWN_AFTER_S = 60, 300
    node = fleet["node"]
    set_cordon(node=node, cordon=NodeCordon.DRAIN, actor=UserFactory())
    assert _core_state(node) == "draining"
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=db_now() - timedelta(seconds=600))
    sweep_nodes()
    sweep_nodes()
    assert Node.objects.get(pk=node.pk).state == NodeState.DOWN
    ingest_heartbeats(node=node, items=[])  # the agent is back
    back = Node.objects.get(pk=node.pk)
    assert (back.state, back.cordon) == (NodeState.READY, NodeCordon.DRAIN)
    assert _core_state(node) == "draining"  # still no new jobs: the operator's decision stands
    ingest_heartbeats(node=node, items=[])
    moves = list(AuditEvent.objects.filter(action="sched.node.state", subject_id=str(node.pk))
                 .order_by("id").values_list("reason_code", "data__from", "data__to", "data__cordon"))
    # Each move audited once, the return too (session 9 note: a recovery left no trace), each
    # with the state it left and the cordon (QA: the sweep's moves had only `to`).
    assert moves == [("heartbeat-missed", "ready", "unknown", "drain"),
                     ("node-down", "unknown", "down", "drain"),
                     ("heartbeat-resumed", "down", "ready", "drain")]


def test_out_of_service_stops_jobs_with_a_grace_and_requeues_them_without_a_retry(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt], django_capture_on_commit_callbacks: Any,
) -> None:
    node = fleet["node"]
    job, attempt = _running_on(node, tenant, make_job, make_attempt)
    operator = UserFactory()
    with django_capture_on_commit_callbacks(execute=True):
        set_cordon(node=node, cordon=NodeCordon.DOWN, actor=operator)
    attempt.refresh_from_db()
    assert (attempt.state, attempt.stop_reason, attempt.grace_seconds) == (
        AttemptState.STOPPING, "evicted", 120,
    )
    event = AuditEvent.objects.get(action="sched.node.cordon", subject_id=str(node.pk))
    assert (event.reason_code, event.actor_id, event.data["from"], event.data["to"]) == (
        "down", str(operator.pk), "", "down",
    )
    ingest_heartbeats(node=node, items=[])
    assert Node.objects.get(pk=node.pk).cordon == NodeCordon.DOWN  # heartbeats keep health only
    assert sweep_nodes()["evicted"] == 0  # already asked; not asked twice
    # An agent that does not know "evicted" reports "cancelled": the server's stop reason decides.
    finish_attempt(attempt=attempt, outcome="cancelled")
    job.refresh_from_db()
    assert (job.state, job.not_before, job.end_reason) == (JobState.QUEUED, None, "")
    assert JobAttempt.objects.get(pk=attempt.pk).outcome == "evicted"
    assert AuditEvent.objects.filter(subject_id=str(job.pk), reason_code="requeued-after-eviction").exists()
    run_scheduling_pass(trigger="test")
    job.refresh_from_db()
    assert job.state == JobState.QUEUED  # the only node is out of service
    set_cordon(node=node, cordon=NodeCordon.NONE)
    run_scheduling_pass(trigger="test")
    assert Job.objects.get(pk=job.pk).state == JobState.SCHEDULED


@pytest.mark.parametrize("change", ["drain", "down", "health-unknown"])
def test_a_pass_does_not_place_on_a_node_cordoned_or_unhealthy_since_its_snapshot(
    change: str, fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job]
) -> None:
    node = fleet["node"]
    fund(tenant["org"], 100_000_000)
    hold = place_hold(org=tenant["org"], amount=3_000_000, key="stale-snapshot", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    job = make_job(JobState.QUEUED, current_hold=hold, gpu_types=["H100"], gpu_count=1)
    loaded = load_snapshot(now=timezone.now())
    result = core.schedule(loaded.snapshot)
    assert [p.job_id for p in result.placements] == [job.pk]
    if change == "health-unknown":  # the sweep, between the read and the write
        Node.objects.filter(pk=node.pk).update(state=NodeState.UNKNOWN)
    else:
        set_cordon(node=node, cordon=change)
    applied = apply_result(loaded=loaded, result=result)
    assert applied.conflicts == [job.pk] and applied.placed == []
    assert not Allocation.objects.filter(node=node).exists()
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED


def test_the_sweep_evicts_from_a_node_taken_out_of_service_elsewhere(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> None:
    node = fleet["node"]
    _job, attempt = _running_on(node, tenant, make_job, make_attempt)
    Node.objects.filter(pk=node.pk).update(cordon=NodeCordon.DOWN)  # e.g. the on-commit step crashed
    assert sweep_nodes()["evicted"] == 1
    assert JobAttempt.objects.get(pk=attempt.pk).stop_reason == "evicted"
    # A node whose health is down has no agent to ask: its attempts end as lost instead.


def test_the_admin_edits_the_cordon_not_the_health(
    client: Client, fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt], django_capture_on_commit_callbacks: Any,
) -> None:
    node = fleet["node"]
    _job, attempt = _running_on(node, tenant, make_job, make_attempt)
    client.force_login(UserFactory(is_staff=True, is_superuser=True))
    url = reverse("admin:scheduling_node_change", args=[node.pk])
    form = client.get(url).context["adminform"].form
    assert "state" not in form.fields and "cordon" in form.fields
    data = {name: form.initial.get(name) or "" for name in form.fields}
    data.update({"cordon": "down", "region": node.region_id, "gpu_type": node.gpu_type_id,
                 "allocations-TOTAL_FORMS": 0, "allocations-INITIAL_FORMS": 0})
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url, data)
    assert response.status_code == 302, response.content[:2000]
    assert Node.objects.get(pk=node.pk).cordon == NodeCordon.DOWN
    assert AuditEvent.objects.filter(action="sched.node.cordon", subject_id=str(node.pk)).count() == 1
    assert JobAttempt.objects.get(pk=attempt.pk).stop_reason == "evicted"
    back = client.post(reverse("admin:scheduling_node_changelist"),
                       {"action": "return_to_service", "_selected_action": [node.pk]}, follow=True)
    assert Node.objects.get(pk=node.pk).cordon == NodeCordon.NONE
    # The admin capitalises a message's first letter: it starts with a word, not the node's name (QA).
    assert f"Node {node.name}: in service." in back.content.decode()


def test_nodes_that_were_draining_keep_the_drain(fleet: dict[str, Any]) -> None:
    migration = import_module("scheduling.migrations.0012_node_cordon")
    Node.objects.filter(pk=fleet["node"].pk).update(state="draining")
    migration._forward(apps, None)
    node = Node.objects.get(pk=fleet["node"].pk)
    assert (node.state, node.cordon) == (NodeState.READY, NodeCordon.DRAIN)


def test_the_sweep_exports_nodes_by_state_and_cordon(fleet: dict[str, Any]) -> None:
    set_cordon(node=fleet["node"], cordon=NodeCordon.DRAIN)
    sweep_nodes()
    assert metrics.NODES.labels("ready", "drain")._value.get() == 1
    set_cordon(node=fleet["node"], cordon=NodeCordon.NONE)
    sweep_nodes()
    assert metrics.NODES.labels("ready", "drain")._value.get() == 0
    assert metrics.NODES.labels("ready", "none")._value.get() == 1


def test_a_job_placed_on_a_node_that_went_silent_before_starting_it_is_requeued_at_once(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt], settings: Any,
) -> None:
    """QA: it sat `scheduled` for minutes until the node was down, then ended `lost` and spent a
    retry. Nothing ran: it is withdrawn and queued again as soon as the node is unknown."""
    settings.METERING_NODE_UNKNOWN_AFTER_S, settings.METERING_NODE_DOWN_AFTER_S = 60, 300
    node = fleet["node"]
    _job, started = _running_on(node, tenant, make_job, make_attempt)  # this one did start
    fund(tenant["org"], 100_000_000)
    hold = place_hold(org=tenant["org"], amount=3_000_000, key="unstarted", project=tenant["project"],
                      user=tenant["user"], gpu_types=["H100"])
    waiting = make_job(JobState.SCHEDULED, current_hold=hold, gpu_types=["H100"], gpu_count=1)
    unstarted = make_attempt(waiting, AttemptState.SCHEDULED, gpu_count=1)
    Allocation.objects.create(attempt=unstarted, node=node, gpu_index=1, allocated_at=unstarted.scheduled_at)
    Node.objects.filter(pk=node.pk).update(last_heartbeat_at=db_now() - timedelta(seconds=90))

    assert sweep_nodes()["withdrawn"] == 1
    assert Node.objects.get(pk=node.pk).state == NodeState.UNKNOWN
    unstarted.refresh_from_db()
    assert (unstarted.state, unstarted.outcome) == (AttemptState.ENDED, "withdrawn")
    requeued = Job.objects.get(pk=waiting.pk)
    assert requeued.state == JobState.QUEUED and requeued.not_before is None
    assert not Allocation.objects.filter(attempt=unstarted, released_at__isnull=True).exists()
    # The started one is left to the node's fate (lost if it is declared down).
    started.refresh_from_db()
    assert started.state == AttemptState.RUNNING


def test_a_withdrawal_rechecks_under_locks_and_covers_a_stop_already_asked(
    fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    make_attempt: Callable[..., JobAttempt],
) -> None:
    """Review: the sweep read the attempts unlocked; a `/started` report or the node's return
    committed meanwhile must win. An unstarted attempt whose stop was already asked is withdrawn
    too (it waited for the node to be declared down)."""
    from scheduling.services.tick import _withdraw

    node = fleet["node"]
    fund(tenant["org"], 100_000_000)

    def unstarted(key: str, index: int, state: str = AttemptState.SCHEDULED) -> JobAttempt:
        hold = place_hold(org=tenant["org"], amount=3_000_000, key=key, project=tenant["project"],
                          user=tenant["user"], gpu_types=["H100"])
        job = make_job(JobState.SCHEDULED, current_hold=hold, gpu_types=["H100"], gpu_count=1)
        attempt = make_attempt(job, state, gpu_count=1)
        Allocation.objects.create(attempt=attempt, node=node, gpu_index=index,
                                  allocated_at=attempt.scheduled_at)
        return attempt

    Node.objects.filter(pk=node.pk).update(state=NodeState.UNKNOWN)
    started = unstarted("started", 0)
    JobAttempt.objects.filter(pk=started.pk).update(state=AttemptState.RUNNING, started_at=timezone.now())
    assert _withdraw(started.pk, started.job_id) is False  # its /started report came first
    assert JobAttempt.objects.get(pk=started.pk).state == AttemptState.RUNNING

    stopping = unstarted("stopping", 1)
    JobAttempt.objects.filter(pk=stopping.pk).update(state=AttemptState.STOPPING, stop_reason="preempted")
    assert sweep_nodes()["withdrawn"] == 1
    stopping.refresh_from_db()
    assert (stopping.state, stopping.outcome) == (AttemptState.ENDED, "preempted")  # the stop's reason

    back = unstarted("back", 2)
    Node.objects.filter(pk=node.pk).update(state=NodeState.READY)  # a heartbeat brought it back
    assert _withdraw(back.pk, back.job_id) is False
    assert JobAttempt.objects.get(pk=back.pk).state == AttemptState.SCHEDULED
