"""A fake GPU Bank server (stdlib http.server in a thread) and an in-process agent runner.

Helpers are handed out as fixtures, not imported, so these tests run the same under any pytest
import mode and under the project's pytest-django configuration (no database is touched).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

from agent.config import Config
from agent.gpus import FakeSampler, parse_fake_gpus
from agent.loop import Agent

T = TypeVar("T")
TOKEN = "node-token-123"


@dataclass
class Recorded:
    """One request the fake server saw, with the status it answered."""

    method: str
    path: str
    auth: str | None
    body: Any
    status: int
    at: float  # time.monotonic() when answered
    wall: float  # time.time() when answered, to compare with file mtimes


@dataclass
class FakeServer:
    """Enough of the agent API to drive the agent; records every request."""

    httpd: ThreadingHTTPServer | None = None
    port: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: list[Recorded] = field(default_factory=list)
    fail_status: int | None = None  # when set, every request gets this status
    retry_after: str | None = None
    heartbeat_interval_s: int = 1
    running_attempts: list[int] = field(default_factory=list)
    starts: dict[int, dict[str, Any]] = field(default_factory=dict)
    stops: dict[int, dict[str, Any]] = field(default_factory=dict)
    repeat_starts: bool = False  # keep sending a start even after /started (idempotency test)
    started: set[int] = field(default_factory=set)
    exit_status: dict[int, int] = field(default_factory=dict)  # per-attempt forced status
    exited: set[int] = field(default_factory=set)
    node_id: int = 7

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- control -----------------------------------------------------------------------------

    def serve(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                server._handle(self, "GET")

            def do_POST(self) -> None:
                server._handle(self, "POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def pause(self) -> None:
        """Stop listening: the agent sees connection refused (a real outage)."""
        assert self.httpd is not None
        self.httpd.shutdown()
        self.httpd.server_close()
        self.httpd = None

    def add_start(
        self,
        attempt_id: int,
        command: str,
        *,
        gpus: list[int] | None = None,
        max_wall: int = 60,
        env: dict[str, str] | None = None,
        job_id: int | None = None,
        timeout_grace: float | None = None,
    ) -> None:
        with self.lock:
            self.starts[attempt_id] = {
                "attempt_id": attempt_id,
                "job_id": job_id or attempt_id + 1000,
                "command": command,
                "gpu_indices": gpus if gpus is not None else [0],
                "max_wall_seconds": max_wall,
                "env": env or {},
            }
            if timeout_grace is not None:
                self.starts[attempt_id]["timeout_grace_seconds"] = timeout_grace

    def add_stop(self, attempt_id: int, reason: str, grace: float) -> None:
        with self.lock:
            self.stops[attempt_id] = {"attempt_id": attempt_id, "reason": reason, "grace_seconds": grace}

    # -- views of what happened --------------------------------------------------------------

    def seen(self, method: str, path: str, status: int | None = None) -> list[Recorded]:
        with self.lock:
            return [
                r
                for r in self.requests
                if r.method == method and r.path == path and (status is None or r.status == status)
            ]

    def exits(self, attempt_id: int, status: int | None = 200) -> list[Recorded]:
        return self.seen("POST", f"/api/v1/agent/attempts/{attempt_id}/exit", status)

    def heartbeats(self) -> list[Recorded]:
        return self.seen("POST", "/api/v1/agent/heartbeats", 200)

    # -- the API -----------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        with self.lock:
            status, payload = self._route(method, h.path, body)
            self.requests.append(
                Recorded(
                    method,
                    h.path,
                    h.headers.get("Authorization"),
                    body,
                    status,
                    time.monotonic(),
                    time.time(),
                )
            )
        data = json.dumps(payload).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        if status >= 400 and self.retry_after is not None:
            h.send_header("Retry-After", self.retry_after)
        h.end_headers()
        h.wfile.write(data)

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if self.fail_status is not None:
            return self.fail_status, {"type": "about:blank", "title": "unavailable", "detail": "test outage"}
        prefix = "/api/v1/agent"
        stops = [s for a, s in self.stops.items() if a not in self.exited]
        if (method, path) == ("POST", f"{prefix}/register"):
            return 200, {
                "node_id": self.node_id,
                "heartbeat_interval_s": self.heartbeat_interval_s,
                "running_attempts": list(self.running_attempts),
            }
        if (method, path) == ("GET", f"{prefix}/assignments"):
            starts = [s for a, s in self.starts.items() if self.repeat_starts or a not in self.started]
            return 200, {"start": starts, "stop": stops}
        if (method, path) == ("POST", f"{prefix}/heartbeats"):
            return 200, {"accepted": len(body["attempts"]), "stop": stops}
        if method == "POST" and path.startswith(f"{prefix}/attempts/"):
            attempt_id, action = int(path.split("/")[-2]), path.split("/")[-1]
            if action == "started":
                self.started.add(attempt_id)
                return 200, {}
            if action == "exit":
                status = self.exit_status.get(attempt_id, 200)
                if status == 200:
                    self.exited.add(attempt_id)
                return status, {}
        return 404, {"detail": "no such route"}


@pytest.fixture
def fake_server() -> Iterator[FakeServer]:
    server = FakeServer()
    server.serve()
    yield server
    if server.httpd is not None:
        server.pause()


def make_config(server: FakeServer, **overrides: Any) -> Config:
    base = Config(
        server=server.url,
        token=TOKEN,
        hostname="node-a",
        region="eu-1",
        fake_gpus="4xH100",
        nvlink_domain="nvl-1",
        ib_group="ib-2",
        heartbeat_interval=0.05,
        poll_interval=0.05,
        timeout_grace=0.3,
        shutdown_grace=0.5,
        shutdown_flush=1.0,
        request_timeout=2.0,
        backoff_base=0.02,
        backoff_cap=0.2,
    )
    return replace(base, **overrides)


@dataclass
class RunningAgent:
    """An agent running its loop in a thread; ``stop()`` is its SIGTERM."""

    agent: Agent
    thread: threading.Thread
    stop_event: threading.Event
    result: list[int]

    def stop(self, timeout: float = 15.0) -> int:
        self.stop_event.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "agent did not shut down"
        return self.result[0]


@pytest.fixture
def run_agent(fake_server: FakeServer) -> Iterator[Callable[..., RunningAgent]]:
    agents: list[RunningAgent] = []

    def start(**overrides: Any) -> RunningAgent:
        config = make_config(fake_server, **overrides)
        agent = Agent(config, parse_fake_gpus(config.fake_gpus or "4xH100", config.hostname), FakeSampler())
        stop = threading.Event()
        result: list[int] = []
        thread = threading.Thread(target=lambda: result.append(agent.run(stop)), daemon=True)
        thread.start()
        running = RunningAgent(agent, thread, stop, result)
        agents.append(running)
        return running

    yield start
    for running in agents:
        if running.thread.is_alive():
            running.stop()


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "condition") -> T:
    """Poll a condition with a deadline: fast when it holds early, bounded when it never does."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    return wait_until


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    path = tmp_path / "job"
    path.mkdir()
    return path
