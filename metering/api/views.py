"""The agent API (docs/agent-protocol.md): node-token bearer auth, JSON in and out, thin views.

Plain Django views rather than DRF: heartbeats are the highest-rate request of the service, and
the agent protocol needs none of DRF's negotiation, pagination or user authentication. Errors are
RFC 9457 problem details like the rest of the API.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from config.errors import DomainError
from ledger.retry import RETRYABLE_SQLSTATES, sqlstate_of
from metering import conf, metrics
from metering.heartbeats import MAX_BIGINT, HeartbeatItem
from metering.reports import ExitReport, assignments, report_exit, report_started
from metering.services import ingest_heartbeats
from scheduling.models import Node
from scheduling.services.nodes import authenticate_node, register_node

# Conflicts worth a retry by the agent: the ledger's, plus lock_not_available (a lock timeout).
AGENT_RETRYABLE_SQLSTATES = RETRYABLE_SQLSTATES | {"55P03"}
View = Callable[..., HttpResponse]


def problem(status: int, type_: str, title: str, detail: str, **extra: Any) -> JsonResponse:
    body = {"type": type_, "title": title, "status": status, "detail": detail, **extra}
    response = JsonResponse(body, status=status, content_type="application/problem+json")
    if status == 401:
        response["WWW-Authenticate"] = "Bearer"
    if status == 503:
        response["Retry-After"] = "1"
    return response


class BadRequest(DomainError):
    type = "invalid-agent-request"
    status = 400
    title = "Invalid request"


def agent_view(*methods: str) -> Callable[[View], View]:
    """Bearer node-token auth, method check, JSON body, domain errors as problem details."""

    def wrap(view: View) -> View:
        @csrf_exempt  # bearer-token API, no cookies: CSRF does not apply
        @functools.wraps(view)
        def inner(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method not in methods:
                return problem(405, "method-not-allowed", "Method not allowed", f"Use {', '.join(methods)}.")
            scheme, _, raw = request.headers.get("Authorization", "").partition(" ")
            # The scheme in any case (RFC 7235), as for API keys.
            node = authenticate_node(raw) if scheme.lower() == "bearer" and raw else None
            if node is None:
                return problem(401, "invalid-node-token", "Unauthorized", "A valid node token is required.")
            body: Any = {}
            if request.method == "POST" and request.body:
                try:
                    body = json.loads(request.body)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    return problem(400, "invalid-json", "Invalid request", "The body is not JSON.")
                except RecursionError:  # review: `[[[[...]]]]` 100,000 deep was a 500
                    return problem(400, "invalid-json", "Invalid request", "The body is nested too deeply.")
            try:
                return view(request, node, body, *args, **kwargs)
            except DomainError as error:
                return problem(error.status, error.type, error.title, error.detail, **error.extra)
            except DatabaseError as error:
                if sqlstate_of(error) in AGENT_RETRYABLE_SQLSTATES:
                    return problem(503, "conflict-retry", "Busy", "A concurrent update won; retry.")
                raise

        return inner

    return wrap


def _int(value: Any, name: str, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    # bool is an int in Python; true/false is never a count or an id.
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BIGINT:
        raise BadRequest(f"{name} must be a non-negative integer.", field=name)
    return value


def parse_heartbeat(body: Any) -> list[HeartbeatItem]:
    attempts = body.get("attempts") if isinstance(body, dict) else None
    if not isinstance(attempts, list):
        raise BadRequest('Expected {"attempts": [...]}.', field="attempts")
    if len(attempts) > conf.seconds("METERING_MAX_BATCH"):
        raise BadRequest(f"At most {conf.seconds('METERING_MAX_BATCH')} attempts per heartbeat.")
    items = []
    for raw in attempts:
        if not isinstance(raw, dict):
            raise BadRequest("Each attempt must be an object.", field="attempts")
        util = raw.get("gpu_utilization")
        bad_util = isinstance(util, bool) or not isinstance(util, int | float) or not 0 <= util <= 100
        if util is not None and bad_util:
            raise BadRequest("gpu_utilization must be 0-100.", field="gpu_utilization")
        items.append(
            HeartbeatItem(
                attempt_id=_int(raw.get("attempt_id"), "attempt_id") or 0,
                seq=_int(raw.get("seq"), "seq") or 0,
                cumulative_gpu_ms=_int(raw.get("cumulative_gpu_ms"), "cumulative_gpu_ms") or 0,
                gpu_utilization=None if util is None else float(util),
                memory_used_mb=_int(raw.get("memory_used_mb"), "memory_used_mb", optional=True),
            )
        )
    return items


@agent_view("POST")
def register(request: HttpRequest, node: Node, body: Any) -> HttpResponse:
    if not isinstance(body, dict) or not isinstance(body.get("gpus"), list):
        raise BadRequest('Expected {"gpus": [...], ...}.', field="gpus")
    for gpu in body["gpus"]:
        index = gpu.get("index") if isinstance(gpu, dict) else None
        if isinstance(index, bool) or not isinstance(index, int):
            raise BadRequest("Each GPU needs an integer index and a model.", field="gpus")
    labels = body.get("labels") if isinstance(body.get("labels"), dict) else {}
    result = register_node(
        node=node,
        gpus=body["gpus"],
        labels=labels,
        agent_version=str(body.get("agent_version") or ""),
        heartbeat_interval_s=conf.seconds("METERING_HEARTBEAT_INTERVAL_S"),
    )
    return JsonResponse(
        {
            "node_id": result.node_id,
            "heartbeat_interval_s": result.heartbeat_interval_s,
            "running_attempts": result.running_attempts,
        }
    )


@agent_view("GET")
def pull_assignments(request: HttpRequest, node: Node, body: Any) -> HttpResponse:
    return JsonResponse(assignments(node=node))


@agent_view("POST")
def started(request: HttpRequest, node: Node, body: Any, attempt_id: int) -> HttpResponse:
    attempt = report_started(node=node, attempt_id=attempt_id)
    return JsonResponse({"attempt_id": attempt.pk, "state": attempt.state})


@agent_view("POST")
def heartbeats(request: HttpRequest, node: Node, body: Any) -> HttpResponse:
    items = parse_heartbeat(body)
    result = ingest_heartbeats(node=node, items=items)
    metrics.HEARTBEAT_ITEMS.labels("accepted").inc(len(result.accepted))
    metrics.HEARTBEAT_ITEMS.labels("rejected").inc(len(result.rejected))
    return JsonResponse({"accepted": len(result.accepted), "rejected": result.rejected, "stop": result.stop})


@agent_view("POST")
def exit_report(request: HttpRequest, node: Node, body: Any, attempt_id: int) -> HttpResponse:
    if not isinstance(body, dict) or not isinstance(body.get("outcome"), str):
        raise BadRequest('Expected {"outcome": ..., "seq": ..., "cumulative_gpu_ms": ...}.')
    report = ExitReport(
        seq=_int(body.get("seq", 0), "seq") or 0,
        cumulative_gpu_ms=_int(body.get("cumulative_gpu_ms", 0), "cumulative_gpu_ms") or 0,
        outcome=body["outcome"],
        exit_code=_signed(body.get("exit_code"), "exit_code"),
        signal=_signed(body.get("signal"), "signal"),
    )
    result = report_exit(node=node, attempt_id=attempt_id, report=report)
    metrics.EXIT_REPORTS.labels("duplicate" if result.duplicate else "applied").inc()
    return JsonResponse(
        {
            "attempt_id": result.attempt_id,
            "job_state": result.job_state,
            "outcome": result.outcome,
            "duplicate": result.duplicate,
        }
    )


def _signed(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > 2**31 - 1:
        raise BadRequest(f"{name} must be an integer or null.", field=name)
    return value
