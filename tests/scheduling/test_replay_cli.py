"""`bench/replay.py` refuses what it cannot run before it loads a trace."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_an_unknown_policy_is_an_error_naming_the_choices() -> None:
    done = subprocess.run(
        [sys.executable, "bench/replay.py", "--trace", "alibaba", "--policies", "FIFO,fifo+easy"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2
    assert "--policies: unknown 'fifo+easy'; choose from FIFO, FIFO+EASY, ours" in done.stderr
    assert done.stdout == ""  # nothing was replayed


def test_a_negative_restart_cost_is_an_error() -> None:
    done = subprocess.run(
        [sys.executable, "bench/replay.py", "--trace", "alibaba", "--restart-seconds", "-5"],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2
    assert "--restart-seconds must be >= 0, got -5.0" in done.stderr
    assert done.stdout == ""  # nothing was replayed
