"""The agent API over HTTP (Django test client): auth, registration, assignments, started, exit."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.test import Client

from ledger.models import HoldState
from metering.models import AttemptUsage
from scheduling.models import AttemptState, Job, JobAttempt, JobState, Node, NodeState
from scheduling.services.nodes import issue_node_token
from tests.metering.conftest import World, mark_node_alive, place_pending, shift_started

PREFIX = "/api/v1/agent"
GPUS = [{"index": i, "model": "H100", "memory_gb": 80, "uuid": f"GPU-{i}"} for i in range(8)]


def agent(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def post(client: Client, path: str, body: Any) -> Any:
    return client.post(f"{PREFIX}{path}", body, content_type="application/json")


def test_bad_or_rotated_tokens_are_refused(world: World) -> None:
    assert Client().get(f"{PREFIX}/assignments").status_code == 401
    assert agent("gpun_nope_nope").get(f"{PREFIX}/assignments").status_code == 401
    old = world.token
    new = issue_node_token(node=world.node)
    response = agent(old).get(f"{PREFIX}/assignments")
    assert response.status_code == 401
    assert response["Content-Type"] == "application/problem+json"
    assert agent(new).get(f"{PREFIX}/assignments").status_code == 200


def test_the_bearer_scheme_of_a_node_token_is_case_insensitive(world: World) -> None:
    """RFC 7235: as for API keys (QA found `bearer <key>` refused there)."""
    for scheme in ("bearer", "BEARER"):
        client = Client(headers={"Authorization": f"{scheme} {world.token}"})
        assert client.get(f"{PREFIX}/assignments").status_code == 200


def test_register_checks_inventory_and_marks_node_ready(world: World) -> None:
    Node.objects.filter(pk=world.node.pk).update(state=NodeState.DOWN)
    wrong = [{**g, "model": "A100"} for g in GPUS]
    assert post(agent(world.token), "/register", {"gpus": wrong}).status_code == 409
    response = post(
        agent(world.token),
        "/register",
        {
            "hostname": "h",
            "gpus": GPUS[:4],
            "labels": {"nvlink_domain": "nvl-9"},
            "agent_version": "0.1",
        },
    )
    assert response.status_code == 200
    body = response.json()
    assert body == {"node_id": world.node.pk, "heartbeat_interval_s": 30, "running_attempts": []}
    world.node.refresh_from_db()
    assert (world.node.state, world.node.gpu_count, world.node.nvlink_domain) == ("ready", 4, "nvl-9")
    assert world.node.last_heartbeat_at is not None


def test_full_protocol_round_trip(world: World, funded: Any, submit: Callable[..., Job]) -> None:
    funded()
    mark_node_alive(world.node)
    job = submit(gpus=2)
    [attempt] = place_pending()
    client = agent(world.token)
    starts = client.get(f"{PREFIX}/assignments").json()["start"]
    assert starts == [
        {
            "attempt_id": attempt.pk,
            "job_id": job.pk,
            "command": "sleep 1",
            "gpu_indices": sorted(a.gpu_index for a in attempt.allocations.all()),
            "max_wall_seconds": 3600,
            "timeout_grace_seconds": 30,
            "env": {"GPUBANK_ATTEMPT_NUMBER": "1", "GPUBANK_NODES": "h100-1", "GPUBANK_NUM_NODES": "1",
                    "GPUBANK_NODE_RANK": "0"},
        }
    ]
    assert post(client, f"/attempts/{attempt.pk}/started", {}).status_code == 200
    assert client.get(f"{PREFIX}/assignments").json()["start"] == []
    shift_started(attempt, 60)
    hb = post(
        client,
        "/heartbeats",
        {
            "attempts": [
                {
                    "attempt_id": attempt.pk,
                    "seq": 1,
                    "cumulative_gpu_ms": 100_000,
                    "gpu_utilization": 97.5,
                    "memory_used_mb": 1024,
                },
            ]
        },
    )
    assert hb.json() == {"accepted": 1, "rejected": [], "stop": []}
    exit_body = {
        "seq": 2,
        "cumulative_gpu_ms": 110_000,
        "exit_code": 0,
        "signal": None,
        "outcome": "completed",
    }
    first = post(client, f"/attempts/{attempt.pk}/exit", exit_body)
    assert first.status_code == 200 and first.json()["duplicate"] is False
    assert first.json()["job_state"] == JobState.COMPLETED
    again = post(client, f"/attempts/{attempt.pk}/exit", {**exit_body, "cumulative_gpu_ms": 999_999})
    assert again.status_code == 200 and again.json()["duplicate"] is True
    attempt.refresh_from_db()
    hold = attempt.hold
    hold.refresh_from_db()
    assert attempt.state == AttemptState.ENDED and hold.state == HoldState.SETTLED
    assert AttemptUsage.objects.get(pk=attempt.pk).billable_gpu_ms == 110_000
    assert hold.captured == 110_000 * attempt.rate_per_gpu_hour // 3_600_000 + (
        1 if 110_000 * attempt.rate_per_gpu_hour % 3_600_000 else 0
    )


def test_attempts_of_another_node_are_invisible(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    funded()
    mark_node_alive(world.node)
    submit(gpus=1)
    [attempt] = place_pending()
    other = Node.objects.create(name="h100-2", region=world.region, gpu_type=world.h100, gpu_count=8)
    stranger = agent(issue_node_token(node=other))
    assert post(stranger, f"/attempts/{attempt.pk}/started", {}).status_code == 404
    assert post(stranger, f"/attempts/{attempt.pk}/exit", {"outcome": "completed"}).status_code == 404
    assert JobAttempt.objects.get(pk=attempt.pk).state == AttemptState.SCHEDULED


def test_malformed_heartbeats_are_400(world: World) -> None:
    client = agent(world.token)
    assert post(client, "/heartbeats", {"attempts": "x"}).status_code == 400
    bad = {"attempts": [{"attempt_id": True, "seq": 1, "cumulative_gpu_ms": 1}]}
    assert post(client, "/heartbeats", bad).status_code == 400
    negative = {"attempts": [{"attempt_id": 1, "seq": 1, "cumulative_gpu_ms": -5}]}
    assert post(client, "/heartbeats", negative).status_code == 400
    assert client.post(f"{PREFIX}/heartbeats", "{", content_type="application/json").status_code == 400
    assert client.get(f"{PREFIX}/heartbeats").status_code == 405


def test_a_start_the_agent_refuses_requeues_the_job_at_once_and_drains_the_node(
    world: Any, funded: Any, submit: Any, django_capture_on_commit_callbacks: Any
) -> None:
    """The agent refuses a start for GPUs its node does not have (its inventory and the server's
    disagree): the node's fault. It was reported `lost`: a retry spent, a backoff, and the job
    placed on the same node again after it. Now the job is requeued at once, no retry spent, and
    the node drained (audited) so it is not placed there again until an operator has looked."""
    from audit.models import AuditEvent
    from scheduling.models import NodeCordon

    funded()
    mark_node_alive(world.node)
    submit(gpus=2, max_wall_seconds=600)
    [attempt] = place_pending()
    client = Client(headers={"Authorization": f"Bearer {world.token}"})
    refused = {"seq": 0, "cumulative_gpu_ms": 0, "exit_code": None, "signal": None, "outcome": "refused"}
    with django_capture_on_commit_callbacks(execute=True):
        answer = post(client, f"/attempts/{attempt.pk}/exit", refused)
    assert answer.status_code == 200, answer.json()
    attempt.refresh_from_db()
    job = attempt.job
    assert (attempt.outcome, job.state, job.not_before) == ("refused", JobState.QUEUED, None)
    assert Node.objects.get(pk=world.node.pk).cordon == NodeCordon.DRAIN
    drained = AuditEvent.objects.get(action="sched.node.cordon", subject_id=str(world.node.pk))
    assert drained.data["why"] == "start-refused"
