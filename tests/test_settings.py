"""Production settings: deploy checks are clean, and secrets have no default."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "SECRET_KEY")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


PRODUCTION = {
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/postgres",
    "REDIS_URL": "redis://127.0.0.1:6379/14",
    "ALLOWED_HOSTS": "gpubank.example.com",
    "DEBUG": "false",
}


def test_check_deploy_is_clean_for_production_settings() -> None:
    result = _manage("check", "--deploy", "--fail-level", "WARNING",
                     SECRET_KEY=secrets.token_urlsafe(50), **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_production_refuses_to_start_without_a_secret_key() -> None:
    result = _manage("check", **PRODUCTION)
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def _scheduler_config(**env: str) -> subprocess.CompletedProcess[str]:
    probe = (
        "from scheduling.adapter.snapshot import scheduler_config; c = scheduler_config(()); "
        "print(c.preemption_exempt_growth, c.preemption_exempt_after, "
        "c.min_runtime_before_preemption_seconds, c.end_time_packing)"
    )
    return _manage("shell", "--no-imports", "-c", probe, **env)


def test_scheduler_knobs_come_from_the_environment_and_default_to_the_core() -> None:
    unset = _scheduler_config()
    assert unset.returncode == 0, unset.stderr
    assert unset.stdout.split() == ["2.0", "5", "600.0", "off"]  # scheduling.core.Config's (ADR 0007)
    set_ = _scheduler_config(
        SCHEDULER_PREEMPT_EXEMPT_GROWTH="1", SCHEDULER_PREEMPT_EXEMPT_AFTER="0",
        SCHEDULER_MIN_RUNTIME_SECONDS="900", SCHEDULER_END_TIME_PACKING="tightest",
    )
    assert set_.returncode == 0, set_.stderr
    assert set_.stdout.split() == ["1.0", "0", "900.0", "tightest"]


def test_a_bad_scheduler_knob_stops_start_up_naming_it() -> None:
    cases = {
        ("SCHEDULER_PREEMPT_EXEMPT_GROWTH", "abc"): "SCHEDULER_PREEMPT_EXEMPT_GROWTH must be a number, got",
        ("SCHEDULER_PREEMPT_EXEMPT_GROWTH", "0.5"): "preemption_exempt_growth must be >= 1",
        ("SCHEDULER_PREEMPT_EXEMPT_AFTER", "2.5"): "SCHEDULER_PREEMPT_EXEMPT_AFTER must be a whole number",
        ("SCHEDULER_MIN_RUNTIME_SECONDS", "-1"): "SCHEDULER_MIN_RUNTIME_SECONDS must be >= 0, got '-1'",
        ("SCHEDULER_RETRY_BACKOFF_SECONDS", "nan"): "SCHEDULER_RETRY_BACKOFF_SECONDS must be a whole number",
        ("SCHEDULER_END_TIME_PACKING", "best"): "end_time_packing must be one of off, tightest, partial",
    }
    for (name, value), message in cases.items():
        result = _manage("check", **{name: value})
        assert result.returncode != 0, name
        assert "ImproperlyConfigured" in result.stderr and message in result.stderr, result.stderr[-400:]
