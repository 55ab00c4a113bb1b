"""``python -m agent`` as a real process: logs carry attempt ids, SIGTERM shuts it down cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_cli_runs_a_job_and_exits_cleanly_on_sigterm(fake_server, wait_for, tmp_path) -> None:
    fake_server.add_start(501, "exit 0", gpus=[1])
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUBANK_AGENT_TOKEN": "node-token-123"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent",
            "--server",
            fake_server.url,
            "--fake-gpus",
            "2xL4",
            "--heartbeat-interval",
            "0.05",
            "--poll-interval",
            "0.05",
            "--hostname",
            "cli-node",
            "--state-dir",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: fake_server.exits(501), what="exit report")
        wait_for(lambda: len(fake_server.heartbeats()) >= 3, what="heartbeats")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
    register = fake_server.seen("POST", "/api/v1/agent/register")[0]
    assert register.auth == "Bearer node-token-123"
    assert [g["model"] for g in register.body["gpus"]] == ["L4", "L4"]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert all(" attempt=" in line for line in lines)
    assert any("attempt=501 " in line and "exit reported" in line for line in lines)
    assert any("SIGTERM" in line for line in lines)
