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
