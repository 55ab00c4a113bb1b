"""Scheduler knobs an operator sets from the environment (or `.env`); docs/scheduler.md, "Settings".

Only variables that are set become settings. Unset ones keep the default where it is used
(`scheduling.core.Config` for the policy, the scheduling services for the rest), so each default
lives in one place. Values are checked here, at start-up, with the core's own rules: a bad value
stops the process with the variable's name instead of failing every scheduler tick later.
"""

import os
from dataclasses import replace

from django.core.exceptions import ImproperlyConfigured

from scheduling.core import Config

_NUMBERS: dict[str, type] = {
    "SCHEDULER_TICK_SECONDS": float,  # beat's period (config/celery.py reads it too)
    "SCHEDULER_SOON_COALESCE_SECONDS": float,  # early passes after a submission/finish coalesce
    "SCHEDULER_RETRY_BACKOFF_SECONDS": int,  # first retry delay of a job that failed transiently
    "SCHEDULER_RETRY_BACKOFF_MAX_SECONDS": int,
    "SCHEDULER_STOP_GRACE_SECONDS": int,  # a cancelled or timed-out job's signal -> kill
    "SCHEDULER_FUNDING_RETRY_SECONDS": int,  # a placed job whose hold could not be funded
    "SCHEDULER_QUEUE_VIEW_SECONDS": float,  # GET /jobs/{id}/priority reuses one ordering this long
    "SCHEDULER_FAIRSHARE_HALF_LIFE_SECONDS": float,
    "SCHEDULER_PREEMPT_GRACE_SECONDS": float,
    "SCHEDULER_MIN_RUNTIME_SECONDS": float,
    "SCHEDULER_PREEMPT_EXEMPT_GROWTH": float,
    "SCHEDULER_PREEMPT_EXEMPT_AFTER": int,
    "SCHEDULER_MAX_RESERVATIONS": int,  # EASY reservations per pass (one per GPU type at most)
}
_CORE_FIELDS = {  # setting -> scheduling.core.Config field it feeds (scheduling/adapter/snapshot.py)
    "SCHEDULER_FAIRSHARE_HALF_LIFE_SECONDS": "fairshare_half_life_seconds",
    "SCHEDULER_PREEMPT_GRACE_SECONDS": "grace_seconds",
    "SCHEDULER_MIN_RUNTIME_SECONDS": "min_runtime_before_preemption_seconds",
    "SCHEDULER_PREEMPT_EXEMPT_GROWTH": "preemption_exempt_growth",
    "SCHEDULER_PREEMPT_EXEMPT_AFTER": "preemption_exempt_after",
    "SCHEDULER_END_TIME_PACKING": "end_time_packing",
    "SCHEDULER_MAX_RESERVATIONS": "max_reservations",
}


def _number(name: str, cast: type) -> float | int:
    raw = os.environ[name]
    try:
        value = cast(raw)
    except ValueError:
        kind = "a whole number" if cast is int else "a number"
        raise ImproperlyConfigured(f"{name} must be {kind}, got {raw!r}") from None
    if value < 0 or value != value:  # negative or NaN
        raise ImproperlyConfigured(f"{name} must be >= 0, got {raw!r}")
    return value


def _read() -> dict[str, object]:
    found: dict[str, object] = {n: _number(n, c) for n, c in _NUMBERS.items() if n in os.environ}
    if "SCHEDULER_END_TIME_PACKING" in os.environ:
        found["SCHEDULER_END_TIME_PACKING"] = os.environ["SCHEDULER_END_TIME_PACKING"]
    core = {_CORE_FIELDS[n]: v for n, v in found.items() if n in _CORE_FIELDS}
    try:
        replace(Config(), **core)  # the core's own checks (growth >= 1, packing mode, ...)
    except ValueError as exc:
        names = ", ".join(sorted(n for n in found if n in _CORE_FIELDS))
        raise ImproperlyConfigured(f"scheduler settings ({names}): {exc}") from None
    return found


_found = _read()
globals().update(_found)
__all__ = list(_found)  # `from .scheduling import *` takes these and nothing else
