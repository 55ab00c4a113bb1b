"""Prometheus metrics of the HTTP layer and the business (docs/observability.md lists them all).

One registry (prometheus_client's default), one `/metrics` view (metering/metrics.py). Metrics are
in-memory counters: updating one is no I/O, but ledger and metering code bumps them only in
`transaction.on_commit`, so a rolled-back or retried transaction counts nothing.
Labels are bounded on purpose: route name, status, GPU type, priority class, problem type —
never an org, user or job id (those belong on traces and log lines).

With `PROMETHEUS_MULTIPROC_DIR` set (gunicorn with several workers, Celery prefork), the client
keeps values in files there and `/metrics` aggregates every process's (multiprocess mode).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from django.db import transaction
from prometheus_client import Counter, Gauge, Histogram

# Seconds. Submissions lock an org's rows; heartbeats are one UPDATE per batch.
_HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_PASS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_LAG_BUCKETS = (0.1, 1.0, 5.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 24 * 3600.0)

HTTP_REQUESTS = Counter(
    "gpubank_http_requests", "HTTP requests, by route name, method and status.",
    ["route", "method", "status"],
)
HTTP_LATENCY = Histogram(
    "gpubank_http_request_duration_seconds",
    "HTTP request latency (whole middleware chain), by route name, method and status.",
    ["route", "method", "status"], buckets=_HTTP_BUCKETS,
)
SUBMISSIONS = Counter(
    "gpubank_job_submissions", "Job submissions (POST /api/v1/jobs), by result.", ["result"]
)
SUBMISSIONS_REJECTED = Counter(
    "gpubank_job_submissions_rejected",
    "Rejected job submissions, by problem type (insufficient-credits, budget-exceeded, "
    "rate-limited, validation-error, ...).",
    ["reason"],
)
SUBMISSION_PATHS = Counter(
    "gpubank_job_submission_paths",
    "POST /api/v1/jobs that reached the submission, by path: one_statement (jobs_submit accepted "
    "it), declined (jobs_submit declined it to the Python path), python (the one-statement path is "
    "off: SQLite, JOBS_SUBMIT_IN_SQL=False).",
    ["path"],
)
HOLD_EVENTS = Counter(
    "gpubank_hold_events", "Ledger hold lifecycle events (placed, extended, settled).", ["event"]
)
LEDGER_MICROCREDITS = Counter(
    "gpubank_ledger_microcredits",
    "Micro-credits moved by committed ledger operations, by transaction kind.", ["kind"],
)
CREDITS_CAPTURED = Counter(
    "gpubank_credits_captured_microcredits",
    "Micro-credits captured for GPU usage (progress and final captures), by GPU type.", ["gpu_type"],
)
ATTEMPTS_SETTLED = Counter(
    "gpubank_attempts_settled", "Attempts whose hold was settled, by outcome.", ["outcome"]
)
SETTLEMENT_LAG = Histogram(
    "gpubank_settlement_lag_seconds",
    "Database time from an attempt's end (exit report, or node declared down) to its settled hold.",
    buckets=_LAG_BUCKETS,
)
SCHEDULER_PASS = Histogram(
    "gpubank_scheduler_pass_duration_seconds",
    "Scheduler pass duration, by phase (load, core, write, total).", ["phase"],
    buckets=_PASS_BUCKETS,
)
SCHEDULER_DECISIONS = Counter(
    "gpubank_scheduler_decisions", "Scheduler decisions written, by kind.", ["kind"]
)
SCHEDULER_PENDING = Gauge(
    "gpubank_scheduler_pending_jobs", "Pending jobs seen by the last scheduler pass, by priority class.",
    ["priority_class"], multiprocess_mode="mostrecent",
)
SCHEDULER_LAST_PASS = Gauge(
    "gpubank_scheduler_last_pass_timestamp", "Unix time of the last completed scheduler pass.",
    multiprocess_mode="mostrecent",
)

NODES = Gauge(
    "gpubank_nodes", "Nodes by health state and operator cordon (none, drain, down), set by the node sweep.",
    ["state", "cordon"], multiprocess_mode="mostrecent",
)

_seen_classes: set[str] = set()
_seen_node_labels: set[tuple[str, str]] = set()
_gpu_type_names: dict[int, str] = {}


def after_commit(update: Callable[[], None]) -> None:
    """Run a metric update once the current transaction commits (at once outside one)."""
    transaction.on_commit(update)


def ledger_movement(*, kind: str, amount: int, settled: bool) -> None:
    """One ledger transaction was written (counted on commit)."""

    def update() -> None:
        LEDGER_MICROCREDITS.labels(kind).inc(amount)
        if kind == "hold":
            HOLD_EVENTS.labels("placed").inc()
        elif kind == "extend":
            HOLD_EVENTS.labels("extended").inc()
        if settled:
            HOLD_EVENTS.labels("settled").inc()

    after_commit(update)


def gpu_type_name(gpu_type_id: int) -> str:
    """GPU type name for a label: cached per process (a handful of rows that never get renamed)."""
    name = _gpu_type_names.get(gpu_type_id)
    if name is None:
        from scheduling.models import GpuType

        _gpu_type_names.update(GpuType.objects.values_list("id", "name"))
        name = _gpu_type_names.setdefault(gpu_type_id, str(gpu_type_id))
    return name


def _attempt_gpu_type(attempt: Any) -> str:
    cached = attempt._state.fields_cache.get("gpu_type")
    return cached.name if cached is not None else gpu_type_name(attempt.gpu_type_id)


def credits_captured(*, attempt: Any, amount: int) -> None:
    """Usage of `attempt` was captured (counted on commit)."""
    if amount > 0:
        gpu_type = _attempt_gpu_type(attempt)
        after_commit(lambda: CREDITS_CAPTURED.labels(gpu_type).inc(amount))


def attempt_settled(*, attempt: Any, outcome: str, captured: int, settled_at: datetime) -> None:
    """The attempt's hold was settled now (database time); lag from the attempt's end."""
    credits_captured(attempt=attempt, amount=captured)
    lag = (settled_at - attempt.ended_at).total_seconds() if attempt.ended_at else None

    def update() -> None:
        ATTEMPTS_SETTLED.labels(outcome or "unknown").inc()
        if lag is not None:
            SETTLEMENT_LAG.observe(max(0.0, lag))

    after_commit(update)


def scheduler_pass(*, load_s: float, core_s: float, write_s: float, pending_classes: Iterable[str],
                   placed: int, preempted: int, backfilled: int) -> None:
    """A scheduler pass committed (called after its transaction)."""
    pending = collections.Counter(pending_classes)
    for phase, seconds in (("load", load_s), ("core", core_s), ("write", write_s),
                           ("total", load_s + core_s + write_s)):
        SCHEDULER_PASS.labels(phase).observe(seconds)
    for kind, count in (("placed", placed), ("preempted", preempted), ("backfilled", backfilled)):
        if count:
            SCHEDULER_DECISIONS.labels(kind).inc(count)
    # Classes with nothing pending any more go to 0 rather than keeping their last value.
    _seen_classes.update(pending)
    for cls in _seen_classes:
        SCHEDULER_PENDING.labels(cls).set(pending.get(cls, 0))
    SCHEDULER_LAST_PASS.set(time.time())


def nodes_by_state(counts: dict[tuple[str, str], int]) -> None:
    """The node sweep counted nodes per (health state, cordon); a pair no longer seen goes to 0."""
    _seen_node_labels.update(counts)
    for state, cordon in _seen_node_labels:
        NODES.labels(state, cordon or "none").set(counts.get((state, cordon), 0))


def submission_path(path: str) -> None:
    """A submission was answered through `path` (see SUBMISSION_PATHS)."""
    SUBMISSION_PATHS.labels(path).inc()


def submission_result(*, status: int, problem_type: str) -> None:
    """POST /api/v1/jobs finished with `status` (problem type for rejections)."""
    if status < 400:
        SUBMISSIONS.labels("accepted").inc()
        return
    SUBMISSIONS.labels("rejected" if status < 500 else "error").inc()
    if status < 500:
        SUBMISSIONS_REJECTED.labels(problem_type or "unknown").inc()
