"""The agent's main loop: register, then poll / start / heartbeat / report until told to stop.

One thread does all HTTP; the runner's supervisor thread does all signalling. A slow or dead server
therefore delays reports, never a SIGKILL or a wall-time limit.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent import __version__
from agent.client import ApiClient, Outcome, Result, backoff_delay
from agent.config import DEFAULT_HEARTBEAT_INTERVAL_S, Config
from agent.gpus import GpuInfo, GpuSampler
from agent.logs import alog
from agent.outbox import Outbox
from agent.runner import STOP_REASONS, ExitRecord, Runner, StartSpec, StopRequest

log = logging.getLogger("agent.loop")

# Attempts we finished recently: a repeated start or stop for them is a no-op. Bounded because
# the server stops mentioning an attempt once its exit is recorded.
_FINISHED_MEMORY = 10_000


class FatalError(Exception):
    """The server refused us in a way retrying cannot fix (bad token, rejected registration)."""


@dataclass
class _Retry:
    tries: int = 0
    next_at: float = 0.0


class Agent:
    """One node's agent; ``run`` blocks until ``stop`` is set, then shuts down cleanly."""

    def __init__(
        self,
        config: Config,
        gpus: list[GpuInfo],
        sampler: GpuSampler,
        *,
        client: ApiClient | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self.gpus = gpus
        self.sampler = sampler
        self.client = client or ApiClient(config.server, config.token, timeout=config.request_timeout)
        self.runner = Runner(timeout_grace=config.timeout_grace, log_dir=config.job_log_dir)
        self.outbox = Outbox(config.outbox_path)
        self.node_id: int | None = None
        self.heartbeat_interval = config.heartbeat_interval or DEFAULT_HEARTBEAT_INTERVAL_S
        self._rng = rng
        self._gpu_indices = frozenset(g.index for g in gpus)
        self._pending_started: dict[int, _Retry] = {}
        # Reports carried over from a previous run are finished attempts too: a server that never
        # got their /started may still list them in `start`, and they must not run twice.
        self._finished: OrderedDict[int, None] = OrderedDict.fromkeys(self.outbox.ids())
        self._poll = _Retry()
        self._next_heartbeat = 0.0
        # While the server gives no HTTP answer at all, every request would just wait for a
        # timeout: skip the network entirely until this (monotonic) time.
        self._down = _Retry()

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def tick(self) -> float:
        return max(0.01, min(0.5, self.heartbeat_interval / 4, self.config.poll_interval / 4))

    def run(self, stop: threading.Event) -> int:
        """Exit status: 0 after a clean shutdown, 2 when the server refused the node."""
        try:
            if not self.register(stop):
                self.client.close()
                return 0
        except FatalError as exc:
            log.error("%s", exc, extra={"attempt": "-"})
            self.client.close()
            return 2
        supervisor_stop = threading.Event()
        supervisor = threading.Thread(
            target=self.runner.supervise_forever,
            args=(supervisor_stop, min(self.tick, 0.1)),
            name="agent-supervisor",
            daemon=True,
        )
        supervisor.start()
        try:
            while not stop.is_set():
                try:
                    self.tick_once()
                except Exception:
                    log.exception("loop tick failed", extra={"attempt": "-"})
                stop.wait(self.tick)
        finally:
            self.shutdown()
            supervisor_stop.set()
            supervisor.join(timeout=5)
            self.client.close()
        return 0

    def register(self, stop: threading.Event) -> bool:
        """Register, retrying with backoff until the server answers; False if stopped first."""
        payload = {
            "hostname": self.config.hostname,
            "region": self.config.region,
            "gpus": [g.to_json() for g in self.gpus],
            "labels": {"nvlink_domain": self.config.nvlink_domain, "ib_group": self.config.ib_group},
            "agent_version": __version__,
        }
        tries = 0
        while not stop.is_set():
            result = self.client.register(payload)
            if result.ok:
                self._registered(result.body)
                return True
            if result.outcome in (Outcome.DROP, Outcome.CONFLICT):
                raise FatalError(f"registration refused: {result.describe()}")
            tries += 1
            delay = self._backoff(tries, result)
            log.warning(
                "registration failed (%s); retry %d in %.2fs",
                result.describe(),
                tries,
                delay,
                extra={"attempt": "-"},
            )
            stop.wait(delay)
        return False

    def _registered(self, body: Any) -> None:
        if not isinstance(body, dict) or not isinstance(body.get("node_id"), int):
            raise FatalError(f"registration response has no integer node_id: {body!r}")
        self.node_id = body["node_id"]
        server_interval = body.get("heartbeat_interval_s")
        if (
            self.config.heartbeat_interval is None
            and isinstance(server_interval, (int, float))
            and server_interval > 0
        ):
            self.heartbeat_interval = float(server_interval)
        log.info(
            "registered node_id=%s gpus=%d heartbeat_interval=%ss",
            self.node_id,
            len(self.gpus),
            self.heartbeat_interval,
            extra={"attempt": "-"},
        )
        # A fresh agent runs nothing, so whatever the server believes runs here died with the
        # previous agent process. Report it lost, unless a persisted exit report says more.
        for attempt_id in body.get("running_attempts") or []:
            if (
                not isinstance(attempt_id, int)
                or attempt_id in self.outbox
                or self.runner.is_running(attempt_id)
            ):
                continue
            alog(
                log,
                logging.WARNING,
                attempt_id,
                "server lists it as running here but it is not; reporting lost",
            )
            self._finish(ExitRecord(attempt_id, 0, 0, None, None, "lost"))

    def shutdown(self) -> None:
        """Stop every job (reported ``lost`` with its real final usage), then deliver what we can."""
        running = self.runner.running_ids()
        if running:
            log.info("shutting down: stopping %d job(s)", len(running), extra={"attempt": "-"})
        grace = self.config.shutdown_grace
        self.runner.terminate_all(grace=grace, outcome="lost", wait=grace + 5)
        self._collect_exits()
        deadline = time.monotonic() + self.config.shutdown_flush
        while (self.outbox or self._pending_started) and time.monotonic() < deadline:
            now = time.monotonic()
            self._flush_started(now)
            self._flush_outbox(now)
            time.sleep(0.02)
        for attempt_id in self.outbox.ids():
            where = self.config.outbox_path or "nowhere (no --state-dir): it is lost"
            alog(log, logging.WARNING, attempt_id, "exit report not delivered; kept in %s", where)

    # -- one iteration -----------------------------------------------------------------------

    def tick_once(self) -> None:
        now = time.monotonic()
        self._collect_exits()
        if now < self._down.next_at:
            return
        if now >= self._poll.next_at:
            self._poll_assignments(now)
        if now >= self._next_heartbeat and now >= self._down.next_at:
            self._next_heartbeat = now + self.heartbeat_interval
            self._send_heartbeat()
        self._collect_exits()
        self._flush_started(time.monotonic())
        self._flush_outbox(time.monotonic())

    def _poll_assignments(self, now: float) -> None:
        result = self.client.assignments()
        if not self._note(result):
            return
        if not result.ok:
            self._poll.tries += 1
            self._poll.next_at = now + self._backoff(self._poll.tries, result)
            log.warning("assignments poll failed: %s", result.describe(), extra={"attempt": "-"})
            return
        self._poll = _Retry(next_at=now + self.config.poll_interval)
        body = result.body if isinstance(result.body, dict) else {}
        stopped = self._apply_stops(body.get("stop"))
        for item in body.get("start") or []:
            spec = self._parse_start(item)
            if spec is None or spec.attempt_id in stopped:
                continue
            self._start(spec)

    def _send_heartbeat(self) -> None:
        samples = self.runner.sample()
        attempts = []
        for s in samples:
            util, mem_mb = self.sampler.sample(s.gpu_indices)
            attempts.append(
                {
                    "attempt_id": s.attempt_id,
                    "seq": s.seq,
                    "cumulative_gpu_ms": s.cumulative_gpu_ms,
                    "gpu_utilization": round(min(max(util, 0.0), 100.0), 1),
                    "memory_used_mb": mem_mb,
                }
            )
        attempts += self._exits_on_their_way({a["attempt_id"] for a in attempts})
        result = self.client.heartbeats({"attempts": attempts})
        if not self._note(result):
            return
        if not result.ok:
            # Skipped, not retried: usage is cumulative, so the next heartbeat carries it all.
            log.warning("heartbeat skipped: %s", result.describe(), extra={"attempt": "-"})
            return
        body = result.body if isinstance(result.body, dict) else {}
        self._apply_stops(body.get("stop"))

    def _exits_on_their_way(self, running: set[int]) -> list[dict[str, Any]]:
        """Attempts that ran here and ended, whose exit report is not delivered yet: each heartbeat
        still names them, with their final usage (the report's own seq and figure, so nothing new),
        so the server knows the agent has them (review: one left out of every heartbeat while its
        report was retried for 5 minutes was ended `lost` by the server and run again). No
        telemetry: they use no GPU now."""
        return [
            {"attempt_id": entry.attempt_id, "seq": entry.body["seq"],
             "cumulative_gpu_ms": entry.body["cumulative_gpu_ms"]}
            for entry in self.outbox.entries()
            if entry.body.get("seq", 0) > 0 and entry.attempt_id not in running
        ]

    # -- starts and stops --------------------------------------------------------------------

    def _parse_start(self, item: Any) -> StartSpec | None:
        try:
            spec = StartSpec(
                attempt_id=_int(item["attempt_id"]),
                job_id=_int(item["job_id"]),
                command=_str(item["command"]),
                gpu_indices=tuple(_int(i) for i in item["gpu_indices"]),
                max_wall_seconds=_int(item["max_wall_seconds"]),
                env={_str(k): _str(v) for k, v in (item.get("env") or {}).items()},
                timeout_grace_seconds=_grace(item.get("timeout_grace_seconds")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            attempt = item.get("attempt_id") if isinstance(item, dict) else None
            alog(
                log,
                logging.ERROR,
                attempt if isinstance(attempt, int) else None,
                "bad start item %r: %s",
                item,
                exc,
            )
            return None
        return spec

    def _start(self, spec: StartSpec) -> None:
        if spec.attempt_id in self._finished or self.runner.is_running(spec.attempt_id):
            return  # idempotent: the server repeats a start until it sees /started
        foreign = sorted(set(spec.gpu_indices) - self._gpu_indices)
        if foreign or not spec.gpu_indices:
            alog(
                log,
                logging.ERROR,
                spec.attempt_id,
                "refusing start: gpu_indices %s not on this node",
                list(spec.gpu_indices),
            )
            # The node's fault, not the job's (its inventory and the server's disagree): `refused`,
            # so the job is requeued elsewhere at once (no retry spent) and the node drained.
            self._finish(ExitRecord(spec.attempt_id, 0, 0, None, None, "refused"))
            return
        if self.runner.start(spec):
            self._pending_started[spec.attempt_id] = _Retry()

    def _apply_stops(self, items: Any) -> set[int]:
        handled: set[int] = set()
        for item in items or []:
            try:
                request = StopRequest(
                    attempt_id=_int(item["attempt_id"]),
                    reason=_str(item["reason"]),
                    grace_seconds=float(item.get("grace_seconds", 0)),
                )
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                log.error("bad stop item %r: %s", item, exc, extra={"attempt": "-"})
                continue
            handled.add(request.attempt_id)
            if request.reason not in STOP_REASONS:
                alog(
                    log,
                    logging.WARNING,
                    request.attempt_id,
                    "unknown stop reason %r; treating as cancelled",
                    request.reason,
                )
                request = StopRequest(request.attempt_id, "cancelled", request.grace_seconds)
            if self.runner.stop(request) or request.attempt_id in self._finished:
                continue
            # Never ran here (stopped before we polled its start): say so, so the server is not
            # left waiting for an exit that would never come.
            alog(
                log,
                logging.WARNING,
                request.attempt_id,
                "stop for an attempt not running here; reporting %s",
                request.reason,
            )
            self._finish(ExitRecord(request.attempt_id, 0, 0, None, None, request.reason))
        return handled

    # -- delivery ----------------------------------------------------------------------------

    def _collect_exits(self) -> None:
        for record in self.runner.take_exits():
            self._finish(record)

    def _finish(self, record: ExitRecord) -> None:
        self._finished[record.attempt_id] = None
        while len(self._finished) > _FINISHED_MEMORY:
            self._finished.popitem(last=False)
        self.outbox.add(record)

    def _flush_started(self, now: float) -> None:
        for attempt_id in list(self._pending_started):
            if not self._send_started(attempt_id, now) and now < self._down.next_at:
                return

    def _send_started(self, attempt_id: int, now: float) -> bool:
        """True once /started is settled (delivered, or refused for good)."""
        state = self._pending_started.get(attempt_id)
        if state is None:
            return True
        if now < state.next_at or now < self._down.next_at:
            return False
        result = self.client.started(attempt_id)
        self._note(result)
        if result.outcome is Outcome.RETRY:
            state.tries += 1
            state.next_at = now + self._backoff(state.tries, result)
            alog(
                log,
                logging.WARNING,
                attempt_id,
                "started not delivered (%s); retry %d",
                result.describe(),
                state.tries,
            )
            return False
        del self._pending_started[attempt_id]
        if not result.ok:
            alog(log, logging.WARNING, attempt_id, "started refused (%s); dropped", result.describe())
        return True

    def _flush_outbox(self, now: float) -> None:
        for entry in self.outbox.due(now):
            if now < self._down.next_at:
                return
            attempt_id = entry.attempt_id
            # The server must see /started before /exit, or it would settle an attempt it never
            # saw start (its own clock, not ours, defines the billable window).
            if not self._send_started(attempt_id, now):
                self.outbox.postpone(attempt_id, self._pending_started[attempt_id].next_at, count=False)
                continue
            result = self.client.exit(attempt_id, entry.body)
            self._note(result)
            if result.ok:
                self.outbox.remove(attempt_id)
                alog(log, logging.INFO, attempt_id, "exit reported outcome=%s", entry.body.get("outcome"))
            elif result.outcome is Outcome.RETRY:
                delay = self._backoff(entry.tries + 1, result)
                self.outbox.postpone(attempt_id, now + delay)
                alog(
                    log,
                    logging.WARNING,
                    attempt_id,
                    "exit not delivered (%s); retry %d in %.2fs",
                    result.describe(),
                    entry.tries,
                    delay,
                )
            else:
                # 409: the server's state cannot take it (already settled another way) - done for us.
                self.outbox.remove(attempt_id)
                alog(log, logging.WARNING, attempt_id, "exit report dropped (%s)", result.describe())

    def _note(self, result: Result) -> bool:
        """Track whether the server answers at all; False (and back off) when it does not."""
        now = time.monotonic()
        if result.unreachable:
            self._down.tries += 1
            self._down.next_at = now + self._backoff(self._down.tries, result)
            if self._down.tries == 1:
                log.warning("server unreachable (%s); backing off", result.describe(), extra={"attempt": "-"})
            return False
        if self._down.tries:
            log.info("server reachable again after %d failed tries", self._down.tries, extra={"attempt": "-"})
            self._down = _Retry()
        return True

    def _backoff(self, tries: int, result: Result) -> float:
        return backoff_delay(
            tries,
            base=self.config.backoff_base,
            cap=self.config.backoff_cap,
            retry_after=result.retry_after,
            rng=self._rng,
        )


def _int(value: Any) -> int:
    # bool is an int subclass in Python; true/false in JSON is never a valid id or count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _grace(value: Any) -> float | None:
    """An optional grace in seconds: absent (an older server) is None; otherwise a number >= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 86_400:
        raise ValueError(f"expected a grace in seconds, got {value!r}")
    return float(value)


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value
