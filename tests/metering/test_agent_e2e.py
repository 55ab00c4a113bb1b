"""End to end: the REAL agent (a subprocess) against the live test server, through register ->
placement (a real scheduling pass) -> run -> heartbeats -> exit -> settled hold."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ledger.models import HoldState
from metering.cost import cost
from metering.models import AttemptUsage
from scheduling.models import AttemptState, Job, JobAttempt, JobState, Node
from tests.metering.conftest import World, place_pending

ROOT = Path(__file__).resolve().parents[2]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_real_agent_runs_a_job_and_the_hold_settles(
    live_server: Any, world: World, funded: Any, submit: Callable[..., Job], tmp_path: Path
) -> None:
    funded()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "--server",
            live_server.url,
            "--token",
            world.token,
            "--fake-gpus",
            "2xH100",
            "--hostname",
            "e2e-node",
            "--heartbeat-interval",
            "0.2",
            "--poll-interval",
            "0.2",
            "--shutdown-grace",
            "1",
            "--state-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: Node.objects.get(pk=world.node.pk).registered_at, 20, "registration")
        assert Node.objects.get(pk=world.node.pk).gpu_count == 2
        job = submit(gpus=2, command="sleep 1", max_wall_seconds=60)
        [attempt] = place_pending()
        wait_for(lambda: JobAttempt.objects.get(pk=attempt.pk).state == AttemptState.ENDED, 30, "the exit")
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode(errors="replace")
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert (attempt.outcome, attempt.exit_code, job.state) == ("completed", 0, JobState.COMPLETED), output
    usage = AttemptUsage.objects.get(pk=attempt.pk)
    # sleep 1 on 2 GPUs: about 2,000 GPU-ms (the agent times from spawn to reap; allow its polling
    # granularity), and billed no more than the DB clock saw.
    assert usage.billable_gpu_ms >= 1_900, output
    elapsed_ms = (attempt.ended_at - attempt.started_at).total_seconds() * 1000
    assert usage.billable_gpu_ms <= elapsed_ms * 2 * 1.01 + 2 * 5_000
    hold = attempt.hold
    hold.refresh_from_db()
    assert hold.state == HoldState.SETTLED
    assert hold.captured == cost(usage.billable_gpu_ms, attempt.rate_per_gpu_hour)
    assert hold.captured + hold.released == hold.authorized
    assert proc.returncode == 0, output
