"""Job supervision: spawn, meter, signal, enforce wall time, reap.

Thread-safe: a supervisor thread polls processes on a short tick so signals and SIGKILL deadlines
are never delayed by a slow HTTP request in the main loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agent.logs import alog

log = logging.getLogger("agent.runner")

# Outcomes the server knows (docs/agent-protocol.md §5); stop reasons are a subset.
# lost: the server already ended the attempt as lost (its node was silent) and it is still running.
STOP_REASONS = frozenset({"preempted", "evicted", "cancelled", "out_of_credit", "timed_out", "lost"})
# Environment variables of the agent that a job must never see (the node token grants node powers).
_PRIVATE_ENV = ("GPUBANK_AGENT_TOKEN",)


@dataclass(frozen=True)
class StartSpec:
    """One ``start`` item from the server."""

    attempt_id: int
    job_id: int
    command: str
    gpu_indices: tuple[int, ...]
    max_wall_seconds: int
    env: Mapping[str, str] = field(default_factory=dict)
    # SIGTERM -> SIGKILL at the wall time, as the server bills it; None: the agent's --timeout-grace.
    timeout_grace_seconds: float | None = None


@dataclass(frozen=True)
class StopRequest:
    """One ``stop`` item from the server."""

    attempt_id: int
    reason: str
    grace_seconds: float


@dataclass(frozen=True)
class UsageSample:
    """One attempt's line in a heartbeat."""

    attempt_id: int
    seq: int
    cumulative_gpu_ms: int
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class ExitRecord:
    """The final report of an attempt; becomes the body of ``/exit``."""

    attempt_id: int
    seq: int
    cumulative_gpu_ms: int
    exit_code: int | None
    signal: int | None
    outcome: str

    def body(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "cumulative_gpu_ms": self.cumulative_gpu_ms,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "outcome": self.outcome,
        }


@dataclass
class _Running:
    spec: StartSpec
    proc: subprocess.Popen[bytes]
    started_at: float
    log_file: IO[bytes] | None
    seq: int = 0
    # Set once, by the first of: a server stop, the wall-time limit, agent shutdown. First wins,
    # so a job killed for its wall time is reported timed_out even if a cancel arrives later.
    outcome: str | None = None
    kill_at: float | None = None
    killed: bool = False

    def gpu_ms(self, now: float) -> int:
        # Allocation-based metering: every GPU the attempt holds, for every elapsed millisecond,
        # measured on the monotonic clock (immune to wall-clock jumps). The server caps it anyway.
        # Never negative (QA): a clock read before a start registered under the lock is older than
        # the run's start; a negative figure was refused (400) and the exit report dropped.
        return max(0, int((now - self.started_at) * 1000)) * len(self.spec.gpu_indices)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    # The job runs in its own session, so its pgid is its pid; signalling the group reaches the
    # shell and everything it spawned (a training launcher's workers included).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _has_exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether the job's shell has exited, without reaping it (WNOWAIT)."""
    if proc.returncode is not None:
        return True
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True  # already reaped elsewhere; Popen.wait() will report what it knows
    return info is not None


class Runner:
    """Owns every job process on this node."""

    def __init__(
        self,
        *,
        timeout_grace: float,
        log_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._timeout_grace = timeout_grace
        self._log_dir = log_dir
        self._clock = clock
        self._lock = threading.Lock()
        self._running: dict[int, _Running] = {}
        self._exits: list[ExitRecord] = []

    # -- commands from the main loop ---------------------------------------------------------

    def start(self, spec: StartSpec) -> bool:
        """Spawn the attempt; False if it runs or has just exited (``start`` is idempotent)."""
        with self._lock:
            if self._known(spec.attempt_id):
                return False
            env = dict(os.environ)
            for name in _PRIVATE_ENV:
                env.pop(name, None)
            env.update(spec.env)
            # Set last: the GPUs the server assigned are the agent's to enforce, not the job env's.
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in spec.gpu_indices)
            env["GPUBANK_ATTEMPT_ID"] = str(spec.attempt_id)
            env["GPUBANK_JOB_ID"] = str(spec.job_id)
            log_file = self._open_log(spec.attempt_id)
            out: IO[bytes] | int = log_file if log_file is not None else subprocess.DEVNULL
            try:
                proc = subprocess.Popen(
                    ["/bin/sh", "-c", spec.command],
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,  # own process group: signals reach the whole job
                    close_fds=True,
                )
            except OSError as exc:
                if log_file is not None:
                    log_file.close()
                alog(log, logging.ERROR, spec.attempt_id, "spawn failed: %s", exc)
                self._exits.append(ExitRecord(spec.attempt_id, 1, 0, None, None, "failed"))
                return True
            self._running[spec.attempt_id] = _Running(spec, proc, self._clock(), log_file)
        alog(
            log,
            logging.INFO,
            spec.attempt_id,
            "started job=%s pid=%s gpus=%s max_wall=%ss",
            spec.job_id,
            proc.pid,
            env["CUDA_VISIBLE_DEVICES"],
            spec.max_wall_seconds,
        )
        return True

    def stop(self, request: StopRequest) -> bool:
        """SIGTERM now, SIGKILL after the grace; False if this runner never had the attempt."""
        with self._lock:
            running = self._running.get(request.attempt_id)
            if running is None:
                return self._known(request.attempt_id)
            if running.outcome is None:
                self._terminate(running, request.reason, request.grace_seconds)
            return True

    def is_running(self, attempt_id: int) -> bool:
        with self._lock:
            return attempt_id in self._running

    def running_ids(self) -> list[int]:
        with self._lock:
            return sorted(self._running)

    def sample(self) -> list[UsageSample]:
        """One heartbeat's worth of usage; each call consumes one seq per attempt."""
        with self._lock:
            now = self._clock()  # under the lock: no run registered after it (QA)
            samples = []
            for attempt_id, running in sorted(self._running.items()):
                running.seq += 1
                samples.append(
                    UsageSample(attempt_id, running.seq, running.gpu_ms(now), running.spec.gpu_indices)
                )
            return samples

    def take_exits(self) -> list[ExitRecord]:
        with self._lock:
            exits, self._exits = self._exits, []
            return exits

    # -- supervision -------------------------------------------------------------------------

    def supervise_once(self) -> None:
        """Reap exits, enforce wall time, escalate to SIGKILL when a grace runs out."""
        with self._lock:
            now = self._clock()  # under the lock: no run registered after it (QA: negative usage)
            for attempt_id, running in list(self._running.items()):
                if _has_exited(running.proc):
                    # The leader is a zombie until polled, so its pid (= the pgid) cannot be reused
                    # yet: clean up the group first, then reap.
                    _signal_group(running.proc, signal.SIGKILL)
                    code = running.proc.wait()
                    self._reap(attempt_id, running, code, now)
                    continue
                limit = running.spec.max_wall_seconds
                if running.outcome is None and limit > 0 and now - running.started_at >= limit:
                    alog(log, logging.WARNING, attempt_id, "max wall time %ss reached", limit)
                    grace = running.spec.timeout_grace_seconds
                    self._terminate(running, "timed_out", self._timeout_grace if grace is None else grace)
                if running.kill_at is not None and not running.killed and now >= running.kill_at:
                    alog(log, logging.WARNING, attempt_id, "grace over, sending SIGKILL to group")
                    _signal_group(running.proc, signal.SIGKILL)
                    running.killed = True

    def supervise_forever(self, stop: threading.Event, tick: float) -> None:
        while not stop.is_set():
            try:
                self.supervise_once()
            except Exception:
                log.exception("supervisor tick failed", extra={"attempt": "-"})
            stop.wait(tick)

    def terminate_all(self, *, grace: float, outcome: str, wait: float) -> None:
        """Agent shutdown: stop every job (keeping any stop already under way) and reap them."""
        with self._lock:
            for running in self._running.values():
                if running.outcome is None:
                    self._terminate(running, outcome, grace)
        deadline = self._clock() + wait
        while self._clock() < deadline:
            self.supervise_once()
            with self._lock:
                if not self._running:
                    return
            time.sleep(0.02)
        with self._lock:
            left = sorted(self._running)
        for attempt_id in left:
            alog(log, logging.ERROR, attempt_id, "still alive after SIGKILL; not reported")

    # -- internals (caller holds the lock) ---------------------------------------------------

    def _known(self, attempt_id: int) -> bool:
        # An attempt that exited but whose exit the loop has not collected yet still counts as
        # ours: without this a repeated start would spawn it again, and a late stop would be
        # mistaken for one about an attempt that never ran here.
        return attempt_id in self._running or any(e.attempt_id == attempt_id for e in self._exits)

    def _terminate(self, running: _Running, outcome: str, grace: float) -> None:
        running.outcome = outcome
        running.kill_at = self._clock() + max(grace, 0.0)
        alog(
            log,
            logging.INFO,
            running.spec.attempt_id,
            "stopping (%s): SIGTERM to group, SIGKILL in %ss",
            outcome,
            grace,
        )
        _signal_group(running.proc, signal.SIGKILL if grace <= 0 else signal.SIGTERM)
        running.killed = grace <= 0

    def _reap(self, attempt_id: int, running: _Running, code: int, now: float) -> None:
        # Whatever the shell left behind in the group (background workers) was killed by the
        # caller: it would otherwise keep holding the GPUs after the attempt is reported done.
        del self._running[attempt_id]
        if running.log_file is not None:
            running.log_file.close()
        exit_code, sig = (None, -code) if code < 0 else (code, None)
        outcome = running.outcome or ("completed" if code == 0 else "failed")
        record = ExitRecord(attempt_id, running.seq + 1, running.gpu_ms(now), exit_code, sig, outcome)
        self._exits.append(record)
        alog(
            log,
            logging.INFO,
            attempt_id,
            "exited outcome=%s exit_code=%s signal=%s gpu_ms=%s",
            outcome,
            exit_code,
            sig,
            record.cumulative_gpu_ms,
        )

    def _open_log(self, attempt_id: int) -> IO[bytes] | None:
        # Job output goes to a per-attempt file, never to the agent's stderr, so every agent line
        # keeps its attempt id. Without a state dir there is nowhere durable to put it.
        if self._log_dir is None:
            return None
        try:
            self._log_dir.mkdir(parents=True, exist_ok=True)
            return open(self._log_dir / f"attempt-{attempt_id}.log", "ab")
        except OSError as exc:
            alog(log, logging.WARNING, attempt_id, "cannot open job log: %s", exc)
            return None
