"""Review of fd090de: `_LEFT_OUT_SQL` is PostgreSQL-only (`::bigint`, `::timestamptz`, `->>`), but
the node sweep also runs in the embedded SQLite mode (DESIGN §13). The old `_left_out` was ORM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import django
django.setup()
from scheduling.services.tick import sweep_nodes
print("SWEEP", sweep_nodes())
"""


def test_the_node_sweep_runs_on_the_embedded_sqlite_mode(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", SQLITE_PATH=str(tmp_path / "db.sqlite3"),
               CELERY_TASK_ALWAYS_EAGER="true")
    subprocess.run([sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True, capture_output=True, timeout=300)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "SWEEP" in done.stdout, done.stderr[-800:]
