"""Metering knobs, read from Django settings with safe defaults (override with METERING_* settings)."""

from __future__ import annotations

import math

from django.conf import settings

_DEFAULTS: dict[str, float] = {
    # What the server tells agents (register response); the liveness timeouts are multiples of it.
    "METERING_HEARTBEAT_INTERVAL_S": 30,
    # Node silent this long -> unknown; this long -> down (its attempts are settled as lost).
    "METERING_NODE_UNKNOWN_AFTER_S": 90,
    "METERING_NODE_DOWN_AFTER_S": 300,
    # A running attempt its live node has left out of every heartbeat for this long is ended `lost`
    # (its agent no longer runs it, e.g. its exit report was refused: QA).
    "METERING_UNREPORTED_ATTEMPT_AFTER_S": 300,
    # Billable cap: elapsed (DB clock) x GPUs x (1 + ratio) + slack per GPU.
    "METERING_CAP_TOLERANCE_RATIO": 0.01,
    "METERING_CAP_SLACK_MS_PER_GPU": 5_000,
    # How often charge_progress runs; also the look-ahead when deciding to extend a hold.
    "METERING_CHARGE_INTERVAL_S": 60,
    # Extend a hold when what is left is below this percentage of it (or below one look-ahead window).
    "METERING_EXTEND_WHEN_LEFT_PERCENT": 10,
    # Default extension window when the org has no hold_window_seconds policy.
    "METERING_EXTENSION_WINDOW_S": 3_600,
    # An active hold nobody runs on (no live attempt, no waiting job) is released after this.
    "METERING_STRANDED_HOLD_AFTER_S": 600,
    # Grace given to an out-of-credit stop (SIGTERM -> SIGKILL).
    "METERING_OUT_OF_CREDIT_GRACE_S": 30,
    # The largest heartbeat batch one request may carry.
    "METERING_MAX_BATCH": 1_024,
}


def value(name: str) -> float:
    return float(getattr(settings, name, _DEFAULTS[name]))


def seconds(name: str) -> int:
    return int(value(name))


def timeout_grace_seconds() -> int:
    """The grace of a run stopped at its max wall time (by its agent, which the server tells in
    each start, or by the server's own time-out) or cancelled: SIGTERM, then SIGKILL."""
    return int(getattr(settings, "SCHEDULER_STOP_GRACE_SECONDS", 30))


def longest_stop_grace() -> float:
    """The longest grace any stop gives a run (signal, then kill): out of credit, a preemption or
    an eviction (the scheduler's checkpoint grace, 120 s by default), a cancellation or a server
    time-out. A stop can come between two charges, and a stopping run's hold is not extended."""
    from scheduling.core import Config

    return max(
        value("METERING_OUT_OF_CREDIT_GRACE_S"),
        float(getattr(settings, "SCHEDULER_PREEMPT_GRACE_SECONDS", Config().grace_seconds)),
        timeout_grace_seconds(),
    )


def lookahead_seconds() -> float:
    """What an attempt may run before a charge can react: two charge intervals, one heartbeat and
    the longest stop's grace (the stop is graceful, so the run goes on meanwhile). A hold is
    extended before less than this is left, and a windowed hold is never placed for less. Review:
    with only the out-of-credit grace (30 s) here, a windowed run preempted just before a charge
    ran its 120 s checkpoint grace past its hold, unpaid."""
    return (
        2 * value("METERING_CHARGE_INTERVAL_S")
        + value("METERING_HEARTBEAT_INTERVAL_S")
        + longest_stop_grace()
    )


def window_floor_seconds() -> int:
    """The least run time a windowed hold is placed for: the look-ahead with the clock tolerance,
    rounded up (273 s by default)."""
    return math.ceil(lookahead_seconds() * (1 + value("METERING_CAP_TOLERANCE_RATIO")))
