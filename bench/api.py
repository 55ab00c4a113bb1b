"""Submissions per second over HTTP vs. calling `submit_job` directly, in the same run.

Run: `.venv/bin/python bench/api.py [--requests 2000] [--clients 16] [--server gunicorn]
[--workers 3] [--threads 4]`
Needs PostgreSQL and Redis on localhost. Creates (and drops) the database `gpubank_bench_api`,
starts the WSGI server on a free loopback port (production settings: PostgreSQL, Redis, DEBUG
off), submits from 16 concurrent HTTP clients — one hot org, then spread over 100 orgs — and
prints throughput, p50/p99 latency and the ratio to the in-process `submit_job` baseline.

`--server` picks the server, each with `--workers` processes of `--threads` Python threads
running `config.wsgi:application` (`server_command`): gunicorn gthread (production's), granian
(`--interface wsgi`, blocking threads; `--backpressure` caps the connections a worker accepts)
or uWSGI (`--http11-socket`; a thread holds a keep-alive connection for its lifetime, so it needs
threads >= clients; not in requirements.txt: `pip install uWSGI==2.0.31` builds it with a C
compiler). `--trivial` serves a tiny WSGI app instead of the service, which measures
the server's own CPU per request.

The clients (`--client raw`, the default) are 16 keep-alive HTTP/1.1 connections over TCP driven
by one thread with raw sockets: each sends a complete request, reads the status line, headers and
body, and checks the status codes (printed). They cost ~0.2 ms of CPU per request on the same 2
cores as the server, against ~2 ms for 16 httpx client threads (`--client httpx`, what earlier
figures used). CPU per request is read from /proc for the server's process tree (master and every
worker with all its threads), the PostgreSQL backends of the bench database (not PostgreSQL's WAL
writer, checkpointer or other background processes) and this process. The direct run's own CPU
per submission is printed as a yardstick of the machine's speed at that moment, and so is how
many connections each server process held 1 s into each run.
"""

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
DB = "gpubank_bench_api"
ENV = {
    "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/{DB}",
    "REDIS_URL": "redis://127.0.0.1:6379/14",
    "SECRET_KEY": "bench-only",
    "SECURE_SSL_REDIRECT": "false",
    "ALLOWED_HOSTS": "127.0.0.1,localhost",
    "LOG_LEVEL": "WARNING",
    "CONN_MAX_AGE": "600",
    "API_RATE_LIMITS": json.dumps({"default": {"key": "1000000/minute", "org": "1000000/minute"}}),
    "DJANGO_SETTINGS_MODULE": "config.settings",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def drop_database() -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"DROP DATABASE IF EXISTS {DB}"], check=True
    )


def setup_database() -> None:
    drop_database()
    subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", f"CREATE DATABASE {DB}"], check=True)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env={**os.environ, **ENV}, check=True
    )


def seed(orgs: int) -> tuple[list[tuple[int, str]], object]:
    """Create `orgs` funded orgs with one project + member + API key each; return (project, key)."""
    os.environ.update(ENV)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from accounts.models import Membership, Organization, Project, Region
    from accounts.services import create_api_key
    from ledger.services import issue_credits
    from scheduling.models import GpuPrice, GpuType, Node, NodeState

    gpu, _ = GpuType.objects.get_or_create(name="H100", defaults={"memory_gb": 80})
    GpuPrice.objects.get_or_create(
        gpu_type=gpu,
        effective_from=timezone.now() - timezone.timedelta(days=1),
        defaults={"price_per_gpu_hour": 4_000_000},
    )
    # A node the 1-GPU jobs could run on: a job no node could ever hold is refused (400).
    region, _ = Region.objects.get_or_create(code="bench", defaults={"name": "bench"})
    Node.objects.get_or_create(name="bench-h100", defaults={
        "region": region, "gpu_type": gpu, "gpu_count": 8, "state": NodeState.READY})
    out = []
    for i in range(orgs):
        org = Organization.objects.create(name=f"bench {i}", slug=f"bench-{i}", max_inflight_submissions=64)
        project = Project.objects.create(org=org, name="p", slug="p")
        user = get_user_model().objects.create(username=f"bench{i}")
        Membership.objects.create(project=project, user=user)
        issue_credits(
            org=org, amount=10**15, kind="paid", source="purchase", reference="bench", reason="bench"
        )
        out.append((project.pk, create_api_key(user=user, name="bench")[1]))
    return out, user


def body(project_id: int) -> dict:
    return {
        "project": project_id,
        "name": "bench",
        "gpu_types": ["H100"],
        "gpu_count": 1,
        "max_wall_seconds": 600,
        "priority_class": "batch",
    }


def _cpu_seconds(pid: int) -> float:
    """utime + stime of one process (and its reaped children), from /proc (Linux only)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """`pid` and all its descendants (children of every thread, recursively), from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def server_pids(master: int) -> tuple[list[int], list[int]]:
    """The server's processes (its master and every descendant: gunicorn's or uWSGI's workers,
    granian's worker processes with their Rust and Python threads), and the PostgreSQL backends
    connected to the bench database. The master is counted too: it serves no request but is the
    server's overhead (gunicorn's heartbeat loop, granian's supervisor)."""
    workers = _tree(master)
    out = subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-U",
            "postgres",
            "-Atc",
            f"SELECT pid FROM pg_stat_activity WHERE datname = '{DB}'",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return workers, [int(p) for p in out]


def connections_per_process(port: int) -> list[int]:
    """How many established connections to `port` each server process holds (`ss`), busiest first."""
    out = subprocess.run(
        ["ss", "-tnpH", "state", "established", f"( sport = :{port} )"], capture_output=True, text=True
    ).stdout
    counts: dict[str, int] = {}
    for line in out.splitlines():
        if "pid=" in line:
            pid = line.split("pid=", 1)[1].split(",", 1)[0]
            counts[pid] = counts.get(pid, 0) + 1
    return sorted(counts.values(), reverse=True)


def _raw_request(project: int, key: str, port: int) -> bytes:
    payload = json.dumps(body(project)).encode()
    return (
        f"POST /api/v1/jobs HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {key}\r\nIdempotency-Key: {uuid.uuid4().hex}\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


def raw_clients(port: int, targets: list[tuple[int, str]], requests: int, clients: int) -> tuple[
    list[float], dict[int, int]
]:
    """`clients` keep-alive HTTP/1.1 connections driven by one thread (selectors, raw sockets).

    Each connection has one request in flight (no pipelining): it sends a full request, reads the
    status line, the headers and `Content-Length` bytes of body, records the latency and status,
    then sends the next. Real HTTP over TCP like the httpx client, at a fraction of its CPU, so
    the machine's 2 cores go to the server being measured.
    """
    import selectors

    sel = selectors.DefaultSelector()
    latencies: list[float] = []
    codes: dict[int, int] = {}
    sent = 0

    def send(sock: socket.socket, state: dict) -> None:
        nonlocal sent
        project, key = targets[sent % len(targets)]
        sent += 1
        state.update(buf=b"", need=-1, start=time.perf_counter())
        sock.sendall(_raw_request(project, key, port))

    for _ in range(min(clients, requests)):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state: dict = {}
        sel.register(sock, selectors.EVENT_READ, state)
        send(sock, state)
    done = 0
    while done < requests:
        for selkey, _ in sel.select(30):
            sock, state = selkey.fileobj, selkey.data
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError("server closed a keep-alive connection")
            state["buf"] += chunk
            buf = state["buf"]
            if state["need"] < 0:
                head_end = buf.find(b"\r\n\r\n")
                if head_end < 0:
                    continue
                head = buf[:head_end].decode("latin-1").split("\r\n")
                headers = dict(line.split(":", 1) for line in head[1:])
                length = {k.strip().lower(): v.strip() for k, v in headers.items()}.get("content-length")
                if length is None:
                    raise RuntimeError(f"response without Content-Length: {head}")
                state["status"] = int(head[0].split(" ", 2)[1])
                state["need"] = head_end + 4 + int(length)
            if len(buf) < state["need"]:
                continue
            latencies.append(time.perf_counter() - state["start"])
            codes[state["status"]] = codes.get(state["status"], 0) + 1
            done += 1
            if sent < requests:
                send(sock, state)  # type: ignore[arg-type]
            else:
                sel.unregister(sock)
                sock.close()  # type: ignore[union-attr]
    for selkey in list(sel.get_map().values()):
        selkey.fileobj.close()  # type: ignore[union-attr]
    return latencies, codes


def httpx_clients(port: int, targets: list[tuple[int, str]], requests: int, clients: int) -> tuple[
    list[float], dict[int, int]
]:
    """`clients` threads, one httpx.Client (keep-alive) each."""
    latencies: list[float] = []
    lock = threading.Lock()
    codes: dict[int, int] = {}
    local = threading.local()

    def one(i: int) -> None:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        project, key = targets[i % len(targets)]
        start = time.perf_counter()
        r = local.client.post(
            "/api/v1/jobs",
            json=body(project),
            headers={"Authorization": f"Bearer {key}", "Idempotency-Key": uuid.uuid4().hex},
        )
        elapsed = time.perf_counter() - start
        with lock:
            latencies.append(elapsed)
            codes[r.status_code] = codes.get(r.status_code, 0) + 1

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))
    return latencies, codes


def http_run(
    port: int, targets: list[tuple[int, str]], requests: int, clients: int, master: int | None = None,
    client: str = "raw",
) -> dict:
    web, db = server_pids(master) if master else ([], [])
    web_before = sum(_cpu_seconds(pid) for pid in web)
    db_before = sum(_cpu_seconds(pid) for pid in db)
    spread: list[int] = []
    snapshot = threading.Timer(1.0, lambda: spread.extend(connections_per_process(port)))
    client_before = time.process_time()  # this process: the HTTP clients
    start = time.perf_counter()
    if master:
        snapshot.start()
    run = raw_clients if client == "raw" else httpx_clients
    latencies, codes = run(port, targets, requests, clients)
    wall = time.perf_counter() - start
    snapshot.cancel()
    client_cpu = time.process_time() - client_before
    web_cpu = sum(_cpu_seconds(pid) for pid in web) - web_before
    db_cpu = sum(_cpu_seconds(pid) for pid in db) - db_before
    if master:  # backends (or workers) that started during the run count from zero
        web_after, db_after = server_pids(master)
        web_cpu += sum(_cpu_seconds(pid) for pid in set(web_after) - set(web))
        db_cpu += sum(_cpu_seconds(pid) for pid in set(db_after) - set(db))
    latencies.sort()
    return {
        "rate": requests / wall,
        "p50": statistics.median(latencies) * 1000,
        "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "codes": codes,
        "web_ms": web_cpu / requests * 1000,
        "db_ms": db_cpu / requests * 1000,
        "client_ms": client_cpu / requests * 1000,
        "spread": spread,
    }


def direct_run(project_id: int, user: object, requests: int) -> dict:
    from accounts.models import Project
    from scheduling.services.submission import JobSpec, submit_job

    project = Project.objects.select_related("org").get(pk=project_id)
    spec = JobSpec(
        name="bench", gpu_types=("H100",), gpu_count=1, max_wall_seconds=600, priority_class="batch"
    )
    member = project.memberships.get().user
    latencies = []
    cpu = time.process_time()
    start = time.perf_counter()
    for _ in range(requests):
        t = time.perf_counter()
        submit_job(user=member, project=project, spec=spec, idempotency_key=uuid.uuid4().hex)
        latencies.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu
    latencies.sort()
    return {
        "rate": requests / wall,
        "p50": statistics.median(latencies) * 1000,
        "p99": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "cpu_ms": cpu / requests * 1000,
    }


def profile(mode: str, requests: int) -> None:
    """One org's submissions through the WSGI app in this process (no HTTP server, one thread).

    `cpu`: cProfile (process CPU) of `requests` submissions, by cumulative then own time;
    `sql`: the statements of one submission; `lock`: per submission, the time from the end of the
    budgets read (the next statement, `ledger_place_hold`, takes the bucket locks) to the end of
    the COMMIT, and each statement in that window.
    """
    import cProfile
    import io
    import pstats

    setup_database()
    targets, _user = seed(1)
    from django.core.wsgi import get_wsgi_application
    from django.db import connection, connections
    from django.test.utils import CaptureQueriesContext

    app = get_wsgi_application()
    project, key = targets[0]
    payload = json.dumps(body(project)).encode()

    def call() -> None:
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": "/api/v1/jobs", "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http",
            "HTTP_HOST": "127.0.0.1", "REMOTE_ADDR": "127.0.0.1", "wsgi.errors": sys.stderr,
            "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(payload)),
            "wsgi.input": io.BytesIO(payload), "HTTP_AUTHORIZATION": f"Bearer {key}",
            "HTTP_IDEMPOTENCY_KEY": uuid.uuid4().hex,
        }
        status: list[str] = []
        out = app(environ, lambda s, h, e=None: status.append(s))
        b"".join(out)
        out.close()
        assert status[0].startswith("201"), status

    for _ in range(50):  # warm caches and the connection
        call()
    if mode == "sql":
        with CaptureQueriesContext(connection) as queries:
            call()
        for q in queries.captured_queries:
            print(f"{q['time']} {q['sql'][:120]} ... {q['sql'][-50:]}")
        return
    if mode == "lock":
        marks: dict[str, float] = {}
        spans: dict[str, list[float]] = {}

        def timed(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            try:
                return execute(sql, params, many, context)
            finally:
                end = time.perf_counter()
                if "start" in marks:
                    spans.setdefault(sql.strip()[:40], []).append((end - marks["last"]) * 1000)
                if "FROM budgets_budget" in sql:
                    marks.setdefault("start", end)
                marks["last"] = end

        wrapper_class = type(connections["default"])
        original = wrapper_class._commit

        def commit(self: Any) -> None:
            original(self)
            marks["commit"] = time.perf_counter()

        wrapper_class._commit = commit
        windows = []
        for _ in range(requests):
            marks.clear()
            with connection.execute_wrapper(timed):
                call()
            windows.append((marks["commit"] - marks["start"]) * 1000)
        windows.sort()
        for sql, times in spans.items():
            print(f"  {sql!r} (since the previous statement): median {statistics.median(times):.2f} ms")
        print(f"budgets read -> COMMIT done: median {statistics.median(windows):.2f} ms, "
              f"p90 {windows[int(len(windows) * 0.9)]:.2f} ms")
        return
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(requests):
        call()
    profiler.disable()
    if out := os.environ.get("BENCH_PROFILE_OUT"):
        profiler.dump_stats(out)
    stats = pstats.Stats(profiler)
    print(f"{stats.total_calls / requests:.0f} Python function calls per submission")  # type: ignore[attr-defined]
    stats.sort_stats("cumulative").print_stats(60)
    stats.sort_stats("tottime").print_stats(30)


def trivial_app(environ: dict, start_response: Any) -> list[bytes]:
    """`--trivial`: a WSGI app that reads the request body and answers 201 with a small JSON body,
    so the CPU the server's processes spend per request is the server's own (HTTP parsing, WSGI
    environ, threads, writes) plus a few microseconds of Python."""
    environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
    out = b'{"id": 1, "state": "pending"}'
    start_response("201 Created", [("Content-Type", "application/json"), ("Content-Length", str(len(out)))])
    return [out]


def server_command(args: argparse.Namespace, port: int) -> tuple[list[str], str]:
    """The server's command line on the loopback `port`, and a label naming it and its shape.

    Same shape for each: `--workers` processes, `--threads` Python threads each running the
    app, HTTP/1.1 keep-alive, warnings-only logging, no access log, `config.wsgi:application`.
    """
    w, t = args.workers, args.threads
    app = "bench.api:trivial_app" if args.trivial else "config.wsgi:application"
    if args.server == "granian":
        bp = ["--backpressure", str(args.backpressure)] if args.backpressure else []
        command = [
            sys.executable, "-m", "granian", "--interface", "wsgi", app,
            "--host", "127.0.0.1", "--port", str(port), "--workers", str(w), "--blocking-threads", str(t),
            "--http", "1", "--no-ws", "--log-level", "warning", "--no-access-log", *bp,
        ]
        bp_label = f", backpressure {args.backpressure}" if args.backpressure else ""
        return command, f"granian {w} workers x {t} blocking threads{bp_label}"
    if args.server == "uwsgi":
        uwsgi = Path(sys.executable).with_name("uwsgi")
        if not uwsgi.exists():
            raise SystemExit(f"{uwsgi} not found: `pip install uWSGI==2.0.31` (needs a C compiler)")
        command = [
            str(uwsgi), "--http11-socket", f"127.0.0.1:{port}",
            "--home", sys.prefix, "--module", app, "--master",
            "--processes", str(w), "--threads", str(t), "--enable-threads", "--disable-logging",
            "--die-on-term", "--need-app", "--lazy-apps", "--thunder-lock",
        ]
        return command, f"uWSGI {w} processes x {t} threads"
    command = [
        sys.executable, "-m", "gunicorn", app, "-b", f"127.0.0.1:{port}",
        "-w", str(w), "--worker-class", "gthread", "--threads", str(t), "--log-level", "warning",
        *(["-c", args.gunicorn_config] if args.gunicorn_config else []),
    ]
    return command, f"gunicorn {w}x{t} gthread"


@contextlib.contextmanager
def running_server(args: argparse.Namespace) -> Iterator[tuple[int, int, str]]:
    """The chosen server on a free loopback port, answering: (port, its pid, its label)."""
    port = free_port()
    command, label = server_command(args, port)
    server = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **ENV})
    try:
        wait_ready(port)
        yield port, server.pid, label
    finally:
        server.terminate()
        server.wait(30)


def trivial(args: argparse.Namespace) -> None:
    with running_server(args) as (port, pid, label):
        http_run(port, [(1, "x")], 500, args.clients, client=args.client)  # warm up
        r = http_run(port, [(1, "x")], args.requests, args.clients, pid, args.client)
    print(
        f"HTTP trivial app ({args.clients} clients, {label}): {r['rate']:.0f}/s p50 {r['p50']:.2f} ms "
        f"p99 {r['p99']:.2f} ms codes {r['codes']} CPU per request: {args.server} {r['web_ms']:.3f} ms, "
        f"{args.client} clients {r['client_ms']:.3f} ms; connections per server process {r['spread']}"
    )


def wait_ready(port: int) -> None:
    for _ in range(300):
        try:
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"no server answered on port {port} within 30 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--server", choices=["gunicorn", "granian", "uwsgi"], default="gunicorn",
                        help="the WSGI server run as in production (see `server_command`)")
    parser.add_argument("--workers", type=int, default=3, help="server processes (~1.5x the cores)")
    parser.add_argument("--threads", type=int, default=4,
                        help="threads per worker: gunicorn gthread threads, granian blocking threads, "
                        "uWSGI threads")
    parser.add_argument("--backpressure", type=int, default=0,
                        help="granian only: max connections a worker accepts, each keep-alive "
                        "connection holding one (0: granian's default)")
    parser.add_argument("--client", choices=["raw", "httpx"], default="raw",
                        help="raw: keep-alive sockets on one thread (cheap); httpx: a thread per client")
    parser.add_argument("--gunicorn-config", default="", help="a gunicorn config file (-c), e.g. hooks")
    parser.add_argument("--trivial", action="store_true",
                        help="serve `trivial_app` instead of the service: the server's own CPU per request")
    parser.add_argument("--profile", choices=["cpu", "sql", "lock"],
                        help="no server: profile submissions in-process instead (see `profile`)")
    args = parser.parse_args()
    if args.profile:
        profile(args.profile, args.requests)
        return
    if args.trivial:
        trivial(args)
        return
    setup_database()
    targets, user = seed(101)
    hot, spread = targets[:1], targets[1:]
    try:
        with running_server(args) as (port, pid, label):
            http_run(port, hot, 100, args.clients, client=args.client)  # warm up connections and workers
            direct = direct_run(hot[0][0], user, args.requests // 4)
            results = {
                "hot org": http_run(port, hot, args.requests, args.clients, pid, args.client),
                "100 orgs": http_run(port, spread, args.requests, args.clients, pid, args.client),
            }
    finally:
        from django.db import connections

        connections.close_all()  # this process's own connection, from seeding and `direct`
        drop_database()
    print(
        f"direct submit_job (1 thread, in-process): {direct['rate']:.0f}/s "
        f"p50 {direct['p50']:.1f} ms p99 {direct['p99']:.1f} ms, Python CPU {direct['cpu_ms']:.2f} ms "
        "per submission (the machine's speed of the moment)"
    )
    cores = os.cpu_count() or 1
    for name, r in results.items():
        print(
            f"HTTP {name} ({args.clients} clients, {label}): "
            f"{r['rate']:.0f}/s "
            f"p50 {r['p50']:.1f} ms p99 {r['p99']:.1f} ms codes {r['codes']} "
            f"ratio to direct {r['rate'] / direct['rate']:.2f} "
            f"CPU per request: {args.server} {r['web_ms']:.1f} ms, PostgreSQL {r['db_ms']:.1f} ms, "
            f"{args.client} clients {r['client_ms']:.1f} ms "
            f"(= {cores * 1000 / (r['web_ms'] + r['db_ms'] + r['client_ms']):.0f}/s if that CPU were all "
            f"{cores} cores did); connections per server process {r['spread']}"
        )


if __name__ == "__main__":
    main()
