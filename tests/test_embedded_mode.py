"""`make run`'s embedded mode (SQLite, no Redis) on the main user and finance flows, in a subprocess
with its own database: the rest of the suite runs on PostgreSQL, and SQLite differs (QA, session 10:
a window budget made every submission a 500 there, because raw rows came back with naive times)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FLOWS = r"""
import django
django.setup()
from datetime import timedelta
from django.utils import timezone
from rest_framework.test import APIClient
from django.contrib.auth import get_user_model
from accounts.models import Organization
from accounts.services import create_api_key
from ledger.models import Bucket
from ledger.services import void_credits
from ledger.verification import verify_ledger

acme = Organization.objects.get(slug="acme")
project = acme.projects.get(slug="llm")
_, raw = create_api_key(user=get_user_model().objects.get(username="alice"), name="smoke")
api = APIClient()
api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")

def check(response, *codes):
    assert response.status_code in codes, (response.status_code, response.content[:500])
    return response

start, month = timezone.now() - timedelta(days=1), timedelta(days=30)
window = {"period": "window", "window_start": start.isoformat(), "window_end": (start + month).isoformat(),
          "limit": 10**12, "enforcement": "hard"}
check(api.put(f"/api/v1/orgs/{acme.pk}/budget", window, format="json", HTTP_IDEMPOTENCY_KEY="b"), 200, 201)
# QA: a user id beyond SQLite's 64-bit integers was a 500 (OverflowError) on the member budget.
huge = f"/api/v1/projects/{project.pk}/members/{2**63}/budget"
check(api.get(huge), 404)
check(api.put(huge, dict(window, limit=1), format="json", HTTP_IDEMPOTENCY_KEY="huge"), 404)
body = {"project": project.pk, "name": "smoke", "gpu_types": ["L4"], "gpu_count": 1, "gpu_memory_gb": 16,
        "max_wall_seconds": 600, "priority_class": "standard"}
job = check(api.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="j"), 201).json()
check(api.get(f"/api/v1/jobs/{job['id']}/priority"), 200, 409)
check(api.post(f"/api/v1/jobs/{job['id']}/hold", HTTP_IDEMPOTENCY_KEY="h"), 200)
check(api.post(f"/api/v1/jobs/{job['id']}/release", HTTP_IDEMPOTENCY_KEY="r"), 200)
assert check(api.get("/api/v1/jobs?state=queued,scheduled,running&name=smoke"), 200).json()["count"] == 1
check(api.get(f"/api/v1/orgs/{acme.pk}/balance", {"as_of": timezone.now().isoformat()}), 200)
check(api.get(f"/api/v1/projects/{project.pk}/balance"), 200)
check(api.get(f"/api/v1/orgs/{acme.pk}/fair-share"), 200)
assert b"closing balance" in check(api.get(f"/api/v1/orgs/{acme.pk}/statement?format=csv"), 200).content
# The dashboard's longest wait (duration arithmetic in SQL) matches the same sums done in Python.
from portal.selectors import queue_by_org_and_reason
from scheduling.models import AttemptState, GpuType, Job, JobAttempt, JobState
queued, now = Job.objects.get(pk=job["id"]), timezone.now()
JobAttempt.objects.create(job=queued, number=1, org_id=acme.pk, state=AttemptState.ENDED,
                          gpu_type=GpuType.objects.get(name="L4"), gpu_count=1, rate_per_gpu_hour=1,
                          hold=queued.current_hold, scheduled_at=now - timedelta(hours=2),
                          started_at=now - timedelta(hours=2), ended_at=now - timedelta(minutes=30))
Job.objects.filter(pk=queued.pk).update(submitted_at=now - timedelta(hours=3), aging_from=None)
expected = {}
for q in Job.objects.filter(state=JobState.QUEUED):
    ran = sum((a.ended_at - a.started_at for a in q.attempts.filter(ended_at__isnull=False)
               if q.aging_from is None or a.started_at >= q.aging_from), timedelta(0))
    since = max(q.submitted_at, q.aging_from or q.submitted_at) + ran
    key = (q.org_id, q.wait_reason)
    expected[key] = min(expected.get(key, since), since)
got = {(r["org_id"], r["reason"]): r["oldest"] for r in queue_by_org_and_reason()}
assert got.keys() == expected.keys() and all(abs((got[k] - expected[k]).total_seconds()) < 1 for k in got), (
    got, expected)
# Plain-SQL reads of datetimes (QA, session 13: both were 500s / a crashed pass on SQLite).
_, expiring = create_api_key(user=get_user_model().objects.get(username="alice"), name="expiring",
                             expires_at=timezone.now() + timedelta(days=1))
other = APIClient()
other.credentials(HTTP_AUTHORIZATION=f"Bearer {expiring}")
check(other.get("/api/v1/orgs"), 200)
from scheduling.models import Node
from scheduling.services.tick import run_scheduling_pass
Node.objects.all().update(state="ready", last_heartbeat_at=timezone.now(),  # as if agents ran
                          maintenance_from=now + timedelta(minutes=5),
                          maintenance_until=now + timedelta(minutes=15))
l4 = dict(body, name="short", max_wall_seconds=60)
short = check(api.post("/api/v1/jobs", l4, format="json", HTTP_IDEMPOTENCY_KEY="s"), 201).json()
run_scheduling_pass(trigger="test")  # the writer re-reads the windows by plain SQL
placed = Job.objects.get(pk=short["id"])
assert placed.state == JobState.SCHEDULED, placed.wait_detail
check(api.post(f"/api/v1/jobs/{job['id']}/cancel", HTTP_IDEMPOTENCY_KEY="c"), 200)
bucket = Bucket.objects.filter(org=acme, available__gt=0).order_by("pk").first()
void_credits(bucket=bucket, reason="smoke", key="smoke", close=True)
# A recount counts a capture made exactly at its window's start (review: the raw SQL compared
# SQLite's text times with an aware "+00:00" bound and left it out).
from django.db.models import Sum
from budgets.models import BudgetPeriod
from budgets.services import set_budget
from ledger.models import LedgerTransaction
from ledger.services import capture, place_hold
edge_hold = place_hold(org=acme, amount=10**6, key="edge", project=project)
at = LedgerTransaction.objects.get(pk=capture(hold=edge_hold, amount=10**5, key="edge").pk).created_at
edge, _ = set_budget(org=acme, project=project, period="window", window_start=at,
                     window_end=at + timedelta(hours=1), limit=10**12, enforcement="soft")
orm = LedgerTransaction.objects.filter(kind="capture", hold__org=acme, hold__project=project,
                                       created_at__gte=at).aggregate(s=Sum("amount"))["s"]
assert BudgetPeriod.objects.get(budget=edge, starts_at=at).spent == orm >= 10**5, orm
assert verify_ledger() == [], verify_ledger()
print("EMBEDDED OK")
"""


@pytest.mark.slow
def test_the_main_flows_work_on_the_embedded_sqlite_mode(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", SQLITE_PATH=str(tmp_path / "db.sqlite3"),
               CELERY_TASK_ALWAYS_EAGER="true")
    for command in (["migrate", "--noinput", "-v", "0"], ["seed_demo"]):
        subprocess.run([sys.executable, "manage.py", *command], cwd=ROOT, env=env, check=True,
                       capture_output=True, timeout=300)
    done = subprocess.run([sys.executable, "-c", FLOWS], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "EMBEDDED OK" in done.stdout, done.stderr[-3000:]
