"""`bench/replay.py` refuses what it cannot run before it loads a trace."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _refused(*args: str) -> str:
    """Run the replay with `args`; it must exit 2 having replayed nothing; returns its stderr."""
    done = subprocess.run(
        [sys.executable, "bench/replay.py", "--trace", "alibaba", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""  # nothing was replayed
    return done.stderr


def test_an_unknown_policy_is_an_error_naming_the_choices() -> None:
    stderr = _refused("--policies", "FIFO,fifo+easy")
    assert "--policies: unknown 'fifo+easy'; choose from FIFO, FIFO+EASY, ours" in stderr


def test_a_negative_restart_cost_is_an_error() -> None:
    assert "--restart-seconds must be >= 0, got -5.0" in _refused("--restart-seconds", "-5")
