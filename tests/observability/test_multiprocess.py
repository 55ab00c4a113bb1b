"""PROMETHEUS_MULTIPROC_DIR: one process's counters appear on another process's /metrics."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.conf import settings

WRITER = """
import django
django.setup()
from django.test import Client
assert Client().get("/metrics", HTTP_X_REQUEST_ID="mp-writer").status_code == 200
from config import metrics
metrics.SCHEDULER_PENDING.labels("batch").set(7)
"""

READER = """
import django
django.setup()
from django.test import Client
print(Client().get("/metrics").content.decode())
"""


def run(code: str, multiproc_dir: Path) -> str:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir),
           "DJANGO_SETTINGS_MODULE": "config.settings.test"}
    done = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_metrics_of_other_processes_are_aggregated(tmp_path: Path) -> None:
    run(WRITER, tmp_path)
    exposed = run(READER, tmp_path)
    # The writer's request and gauge, read by a different process; reconciliation still there.
    assert 'gpubank_http_requests_total{method="GET",route="metrics",status="200"} 1.0' in exposed
    assert 'gpubank_scheduler_pending_jobs{priority_class="batch"} 7.0' in exposed
    assert "gpubank_reconciliation_last_run_timestamp" in exposed
