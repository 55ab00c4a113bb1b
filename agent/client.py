"""HTTP to the service: one request per call, classified; the caller owns retry timing.

The client never sleeps or retries by itself. The main loop must keep heartbeating and supervising
while a report waits out a backoff, so retries are scheduled by the caller with ``backoff_delay``.
"""

from __future__ import annotations

import email.utils
import enum
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from agent import __version__

API_PREFIX = "/api/v1/agent"
# A server asking us to wait longer than this is more likely broken than busy.
MAX_RETRY_AFTER_S = 600.0


class Outcome(enum.Enum):
    """What a response means for the message that produced it."""

    OK = "ok"  # 2xx: delivered
    RETRY = "retry"  # connection error, timeout, 408, 429, 5xx: try again later
    CONFLICT = "conflict"  # 409: the server's state cannot accept it; for the agent it is done
    DROP = "drop"  # any other 4xx: retrying cannot help; log and drop


@dataclass(frozen=True)
class Result:
    """The classified result of one request."""

    outcome: Outcome
    status: int | None = None  # None: no HTTP response at all (connection refused, timeout)
    body: Any = None
    retry_after: float | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def unreachable(self) -> bool:
        """No HTTP answer: the server is down or the network is; more requests now would only wait."""
        return self.status is None

    def describe(self) -> str:
        if self.status is None:
            return f"no response ({self.error})"
        detail = f": {self.error}" if self.error else ""
        return f"HTTP {self.status}{detail}"


def classify(status: int) -> Outcome:
    if 200 <= status < 300:
        return Outcome.OK
    if status == 409:
        return Outcome.CONFLICT
    if status in (408, 429) or status >= 500:
        return Outcome.RETRY
    return Outcome.DROP


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), MAX_RETRY_AFTER_S)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    # An HTTP-date necessarily uses our wall clock; it only shapes a delay, never a billed fact.
    delta = when.timestamp() - (time.time() if now is None else now)
    return min(max(delta, 0.0), MAX_RETRY_AFTER_S)


def backoff_delay(
    tries: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None = None,
    rng: Callable[[], float] = random.random,
) -> float:
    """Exponential backoff with "equal jitter": between half and all of min(cap, base * 2**(tries-1)).

    Half is fixed so a fleet never retries immediately; half is random so a fleet that lost the
    server at the same moment does not come back in lockstep. Retry-After is a floor.
    """
    ceiling: float = min(cap, base * 2.0 ** max(tries - 1, 0))
    delay: float = ceiling / 2 + rng() * ceiling / 2
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


class ApiClient:
    """The five agent endpoints, each one HTTP request with a bearer node token."""

    def __init__(
        self, server: str, token: str, *, timeout: float, transport: httpx.BaseTransport | None = None
    ):
        self._http = httpx.Client(
            base_url=server.rstrip("/"),
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": f"gpubank-agent/{__version__}",
                "Accept": "application/json",
            },
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def register(self, payload: dict[str, Any]) -> Result:
        return self._request("POST", f"{API_PREFIX}/register", payload)

    def assignments(self) -> Result:
        return self._request("GET", f"{API_PREFIX}/assignments")

    def started(self, attempt_id: int) -> Result:
        return self._request("POST", f"{API_PREFIX}/attempts/{attempt_id}/started", {})

    def heartbeats(self, payload: dict[str, Any]) -> Result:
        return self._request("POST", f"{API_PREFIX}/heartbeats", payload)

    def exit(self, attempt_id: int, payload: dict[str, Any]) -> Result:
        return self._request("POST", f"{API_PREFIX}/attempts/{attempt_id}/exit", payload)

    def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Result:
        try:
            response = self._http.request(method, path, json=payload)
        except httpx.HTTPError as exc:
            # Covers connect errors, timeouts and broken connections: all transient from our side.
            return Result(Outcome.RETRY, error=f"{type(exc).__name__}: {exc}")
        outcome = classify(response.status_code)
        body: Any = None
        error: str | None = None
        try:
            body = response.json() if response.content else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            error = "response body is not JSON"
        if outcome is not Outcome.OK and isinstance(body, dict):
            # RFC 9457 problem details: "detail" is the human explanation worth logging.
            error = str(body.get("detail") or body.get("title") or "") or error
        return Result(
            outcome,
            status=response.status_code,
            body=body,
            retry_after=parse_retry_after(response.headers.get("Retry-After")),
            error=error,
        )
