"""Heartbeat ingestion throughput: HTTP (gunicorn, PostgreSQL, Redis) vs the service call vs raw SQL.

    .venv/bin/python bench/heartbeats.py [--seconds 10] [--senders 8] [--batch 64] [--workers 3]

Each sender is one node with `batch` running attempts; every request carries all of them (one
job-heartbeat per attempt). Three phases, same run, same database, same attempts:
  1. raw SQL baseline: one `UPDATE … FROM (VALUES …)` per batch over psycopg (no Django),
  2. the service call alone: `metering.services.ingest_heartbeats` in-process,
  3. HTTP: POST /api/v1/agent/heartbeats against gunicorn on a loopback port, as in production.
Printed: job-heartbeats/s, ratios to the baseline, p50/p99 latency per batch, and a final check
that every attempt's stored usage equals the highest cumulative value sent (zero lost, zero
double-counted). Uses its own database (`gpubank_bench_heartbeats`, recreated each run).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DB_NAME = "gpubank_bench_heartbeats"
PG = os.environ.get("BENCH_PG", "postgres://postgres@127.0.0.1:5432")
REDIS = os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/14")
ENV = {
    "DATABASE_URL": f"{PG}/{DB_NAME}",
    "REDIS_URL": REDIS,
    "SECRET_KEY": "bench-only",
    "SECURE_SSL_REDIRECT": "False",  # loopback, as behind a TLS-terminating proxy
    "LOG_LEVEL": "WARNING",
    "DJANGO_SETTINGS_MODULE": "config.settings",
}


@dataclass
class Fleet:
    """One node per sender, `batch` running attempts on each; `sent` = highest cumulative per attempt."""

    nodes: list[tuple[int, str, list[int]]]
    sent: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


@dataclass
class Phase:
    name: str
    items: int
    seconds: float
    latencies: list[float]

    @property
    def rate(self) -> float:
        return self.items / self.seconds

    def pct(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else 0.0


def recreate_database() -> None:
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {DB_NAME}")
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env={**os.environ, **ENV}, check=True
    )


def seed(senders: int, batch: int) -> Fleet:
    """Nodes with real tokens, jobs with real holds, attempts running for a week (DB clock)."""
    os.environ.update(ENV)
    import django

    django.setup()
    from django.utils import timezone

    from accounts.models import Organization, Project, Region
    from ledger.models import MICRO
    from ledger.services import issue_credits, place_hold
    from metering.models import AttemptUsage
    from scheduling.models import (
        Allocation,
        AttemptState,
        GpuType,
        Job,
        JobAttempt,
        JobState,
        Node,
        NodeState,
        PriorityClass,
    )
    from scheduling.services.nodes import issue_node_token

    region = Region.objects.create(code="bench", name="Bench")
    h100 = GpuType.objects.get_or_create(name="H100", defaults={"memory_gb": 80})[0]
    org = Organization.objects.create(name="Bench", slug="bench")
    project = Project.objects.create(org=org, name="p", slug="p")
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create(username="bench")
    issue_credits(
        org=org, amount=10**6 * MICRO, kind="paid", source="purchase", reference="bench", reason="bench"
    )
    klass = PriorityClass.objects.get(name="standard")
    # Started a week ago: each heartbeat claims 1 s more per attempt, and at ~150,000 heartbeats/s the
    # three phases claim more than an hour per attempt; the server caps usage at the elapsed time,
    # which with a one-hour start read as lost heartbeats (session 16).
    started = timezone.now() - timezone.timedelta(days=7)
    nodes = []
    for n in range(senders):
        node = Node.objects.create(
            name=f"bench-{n}", region=region, gpu_type=h100, gpu_count=batch, state=NodeState.READY
        )
        token = issue_node_token(node=node)
        ids = []
        for i in range(batch):
            hold = place_hold(
                org=org,
                amount=10 * MICRO,
                key=f"bench-{n}-{i}",
                project=project,
                user=user,
                gpu_types=["H100"],
            )
            job = Job.objects.create(
                org=org,
                project=project,
                user=user,
                name="b",
                gpu_types=["H100"],
                gpu_count=1,
                max_wall_seconds=86_400,
                priority_class=klass,
                state=JobState.RUNNING,
                current_hold=hold,
                submitted_at=started,
            )
            attempt = JobAttempt.objects.create(
                job=job,
                number=1,
                org_id=org.pk,
                state=AttemptState.RUNNING,
                gpu_type=h100,
                gpu_count=1,
                rate_per_gpu_hour=3_600_000,
                hold=hold,
                scheduled_at=started,
                started_at=started,
            )
            Allocation.objects.create(attempt=attempt, node=node, gpu_index=i, allocated_at=started)
            AttemptUsage.objects.create(attempt=attempt, org_id=org.pk)
            ids.append(attempt.pk)
        nodes.append((node.pk, token, ids))
    from django.db import connection

    connection.close()
    return Fleet(nodes)


Send = Callable[[int, int, list[tuple[int, int, int]]], None]


def run_phase(name: str, fleet: Fleet, seconds: float, send: Send) -> Phase:
    """Each sender loops: bump every attempt's seq and cumulative usage, send one batch."""
    latencies: list[float] = []
    counted = [0]
    stop = time.monotonic() + seconds
    lat_lock = threading.Lock()

    def sender(index: int) -> None:
        node_id, _, ids = fleet.nodes[index]
        while time.monotonic() < stop:
            with fleet.lock:
                batch = []
                for a in ids:
                    fleet.sent[a] = fleet.sent.get(a, 0) + 1_000  # 1 s of one GPU per heartbeat
                    batch.append((a, fleet.sent[a] // 1_000, fleet.sent[a]))
            t0 = time.perf_counter()
            send(index, node_id, batch)
            dt = time.perf_counter() - t0
            with lat_lock:
                latencies.append(dt)
                counted[0] += len(batch)

    began = time.monotonic()
    threads = [threading.Thread(target=sender, args=(i,)) for i in range(len(fleet.nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Phase(name, counted[0], time.monotonic() - began, latencies)


RAW_SQL = """
    WITH v (attempt_id, seq, gpu_ms) AS (VALUES {rows})
    UPDATE metering_attemptusage u SET
        reported_gpu_ms = GREATEST(u.reported_gpu_ms, v.gpu_ms),
        billable_gpu_ms = GREATEST(u.billable_gpu_ms, LEAST(GREATEST(u.reported_gpu_ms, v.gpu_ms),
                                                            u.billable_gpu_ms + 1000000000)),
        last_seq = GREATEST(u.last_seq, v.seq), last_heartbeat_at = now()
    FROM v WHERE u.attempt_id = v.attempt_id
"""


def raw_sql_sender(senders: int) -> Send:
    conns = [psycopg.connect(ENV["DATABASE_URL"], autocommit=True) for _ in range(senders)]
    for conn in conns:  # the same durability as the service's heartbeat commits (asynchronous)
        conn.execute("SET synchronous_commit = off")

    def send(index: int, node_id: int, batch: list[tuple[int, int, int]]) -> None:
        rows = ", ".join(["(%s::bigint, %s::bigint, %s::bigint)"] * len(batch))
        conns[index].execute(RAW_SQL.format(rows=rows), [x for item in batch for x in item])

    return send


def service_sender() -> Send:
    from django.db import connection

    from metering.heartbeats import HeartbeatItem
    from metering.services import ingest_heartbeats
    from scheduling.models import Node

    nodes: dict[int, Node] = {}

    def send(index: int, node_id: int, batch: list[tuple[int, int, int]]) -> None:
        node = nodes.get(node_id) or nodes.setdefault(node_id, Node.objects.get(pk=node_id))
        ingest_heartbeats(node=node, items=[HeartbeatItem(a, s, ms, 50.0, 1024) for a, s, ms in batch])
        assert connection.connection is not None

    return send


def http_sender(fleet: Fleet, port: int) -> Send:
    clients = [
        httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"}, timeout=30
        )
        for _, token, _ in fleet.nodes
    ]
    failures = [0]

    def send(index: int, node_id: int, batch: list[tuple[int, int, int]]) -> None:
        body = {
            "attempts": [
                {
                    "attempt_id": a,
                    "seq": s,
                    "cumulative_gpu_ms": ms,
                    "gpu_utilization": 50.0,
                    "memory_used_mb": 1024,
                }
                for a, s, ms in batch
            ]
        }
        response = clients[index].post("/api/v1/agent/heartbeats", json=body)
        if response.status_code != 200 or response.json()["accepted"] != len(batch):
            failures[0] += 1
            raise SystemExit(f"heartbeat failed: {response.status_code} {response.text[:200]}")

    return send


def start_server(workers: int, threads: int) -> tuple[subprocess.Popen[bytes], int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "config.wsgi:application",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            str(workers),
            "-k",
            "gthread",
            "--threads",
            str(threads),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={**os.environ, **ENV, "CONN_MAX_AGE": "600"},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return proc, port
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("gunicorn did not come up")


def verify(fleet: Fleet) -> tuple[int, int]:
    """(lost, double-counted): attempts whose stored usage is below / above the max sent."""
    with psycopg.connect(ENV["DATABASE_URL"]) as conn:
        stored = dict(
            conn.execute(
                "SELECT attempt_id, billable_gpu_ms FROM metering_attemptusage"
                " WHERE reported_gpu_ms = billable_gpu_ms"
            ).fetchall()
        )
    lost = sum(1 for a, ms in fleet.sent.items() if stored.get(a, -1) < ms)
    double = sum(1 for a, ms in fleet.sent.items() if stored.get(a, -1) > ms)
    return lost, double


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--senders", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    recreate_database()
    fleet = seed(args.senders, args.batch)
    phases = [run_phase("raw SQL (baseline)", fleet, args.seconds, raw_sql_sender(args.senders))]
    phases.append(run_phase("service call", fleet, args.seconds, service_sender()))
    proc, port = start_server(args.workers, args.threads)
    try:
        run_phase("warm-up", fleet, 1.0, http_sender(fleet, port))
        phases.append(run_phase("HTTP (gunicorn)", fleet, args.seconds, http_sender(fleet, port)))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    lost, double = verify(fleet)
    base = phases[0].rate
    print(
        f"heartbeats: {args.senders} senders x {args.batch} attempts/request, "
        f"{args.seconds:.0f}s per phase, gunicorn {args.workers}w x {args.threads}t, {os.cpu_count()} CPUs"
    )
    print(f"{'phase':<22}{'job-hb/s':>12}{'ratio':>8}{'p50 ms':>9}{'p99 ms':>9}{'batches':>9}")
    for p in phases:
        print(
            f"{p.name:<22}{p.rate:>12,.0f}{p.rate / base:>8.2f}{p.pct(0.5):>9.1f}{p.pct(0.99):>9.1f}"
            f"{len(p.latencies):>9}"
        )
    print(
        f"verify: {len(fleet.sent)} attempts, lost={lost}, double-counted={double}, "
        f"median batch={statistics.median(len(n[2]) for n in fleet.nodes)}"
    )
    if lost or double:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
