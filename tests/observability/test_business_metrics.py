"""Business metrics over one job's life: scheduler pass, heartbeat, exit report, settlement."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test import Client

from ledger.models import HoldState
from metering.cost import cost
from scheduling.models import Job
from tests.metering.conftest import H100_RATE, World, mark_node_alive, place_pending, shift_started
from tests.observability.scrape import delta, scrape, value

pytestmark = pytest.mark.django_db

PREFIX = "/api/v1/agent"
PASS = "gpubank_scheduler_pass_duration_seconds"


def agent_post(client: Client, path: str, body: Any) -> Any:
    return client.post(f"{PREFIX}{path}", body, content_type="application/json")


def test_job_life_moves_the_business_counters(
    world: World, funded: Any, submit: Callable[..., Job],
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    funded()
    mark_node_alive(world.node)
    before = scrape()
    with django_capture_on_commit_callbacks(execute=True):
        submit(gpus=2)
        submit(gpus=4, priority_class="batch")
        submit(gpus=8, priority_class="batch")  # 2 + 4 fill 6 of the node's 8 GPUs: this one waits
    mid = scrape()
    assert delta(before, mid, "gpubank_hold_events_total", event="placed") == 3
    with django_capture_on_commit_callbacks(execute=True):
        placed = place_pending()
    assert len(placed) == 2
    after_pass = scrape()
    for phase in ("load", "core", "write", "total"):
        assert delta(mid, after_pass, f"{PASS}_count", phase=phase) == 1
    assert delta(mid, after_pass, "gpubank_scheduler_decisions_total", kind="placed") == 2
    # The gauge is the last pass's view: 3 jobs pending when it loaded, by class.
    assert value(after_pass, "gpubank_scheduler_pending_jobs", priority_class="standard") == 1
    assert value(after_pass, "gpubank_scheduler_pending_jobs", priority_class="batch") == 2
    assert value(after_pass, "gpubank_scheduler_last_pass_timestamp") > 0

    attempt = next(a for a in placed if a.gpu_count == 2)
    client = Client(headers={"Authorization": f"Bearer {world.token}"})
    assert agent_post(client, f"/attempts/{attempt.pk}/started", {}).status_code == 200
    shift_started(attempt, 60)
    with django_capture_on_commit_callbacks(execute=True):
        heartbeat = agent_post(client, "/heartbeats", {"attempts": [
            {"attempt_id": attempt.pk, "seq": 1, "cumulative_gpu_ms": 100_000},
        ]})
        assert heartbeat.json()["accepted"] == 1
        exit_report = agent_post(client, f"/attempts/{attempt.pk}/exit", {
            "seq": 2, "cumulative_gpu_ms": 110_000, "exit_code": 0, "signal": None,
            "outcome": "completed",
        })
        assert exit_report.status_code == 200
    after = scrape()
    attempt.hold.refresh_from_db()
    assert attempt.hold.state == HoldState.SETTLED
    assert delta(after_pass, after, "gpubank_heartbeat_items_total", result="accepted") == 1
    assert delta(after_pass, after, "gpubank_exit_reports_total", result="applied") == 1
    assert delta(after_pass, after, "gpubank_attempts_settled_total", outcome="completed") == 1
    assert delta(after_pass, after, "gpubank_hold_events_total", event="settled") == 1
    assert delta(after_pass, after, "gpubank_credits_captured_microcredits_total",
                 gpu_type="H100") == cost(110_000, H100_RATE)
    assert delta(after_pass, after, "gpubank_settlement_lag_seconds_count") == 1
    heartbeat_route = {"route": "agent:heartbeats", "method": "POST", "status": "200"}
    assert delta(after_pass, after, "gpubank_http_request_duration_seconds_count", **heartbeat_route) == 1
