"""`manage.py demo_fleet` against the live test server: agents come up, run a job, get restarted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from scheduling.models import AttemptState, Job, JobAttempt, Node
from tests.metering.conftest import World, place_pending
from tests.metering.test_agent_e2e import wait_for

ROOT = Path(__file__).resolve().parents[2]


def agent_pids(fleet: subprocess.Popen[bytes]) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(fleet.pid)], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


@pytest.mark.slow
def test_demo_fleet_runs_agents_and_restarts_them(
    live_server: Any, world: World, funded: Any, submit: Callable[..., Job], tmp_path: Path
) -> None:
    funded()
    Node.objects.filter(pk=world.node.pk).update(gpu_count=2)
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "TEST_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }
    fleet = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "demo_fleet",
            "--server",
            live_server.url,
            "--skip-checks",
            "--heartbeat-interval",
            "0.3",
            "--poll-interval",
            "0.3",
            "--state-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: Node.objects.get(pk=world.node.pk).registered_at, 30, "registration")
        submit(gpus=2, command="sleep 0.5", max_wall_seconds=60)
        [attempt] = place_pending()
        wait_for(lambda: JobAttempt.objects.get(pk=attempt.pk).state == AttemptState.ENDED, 30, "the job")
        assert JobAttempt.objects.get(pk=attempt.pk).outcome == "completed"
        [first] = wait_for(lambda: agent_pids(fleet), 10, "the agent process")
        os.kill(first, signal.SIGKILL)  # an agent dies: the fleet starts a new one
        wait_for(lambda: [p for p in agent_pids(fleet) if p != first], 20, "a restarted agent")
    finally:
        fleet.send_signal(signal.SIGTERM)
        output = fleet.communicate(timeout=60)[0].decode(errors="replace")
    assert "restart 1" in output, output
    assert fleet.returncode == 0, output
