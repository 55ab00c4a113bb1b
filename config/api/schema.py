"""drf-spectacular hooks: every operation documents problem-details errors and idempotency."""

from typing import Any

from config.api.exceptions import PROBLEM_CONTENT_TYPE

MUTATING = ("post", "put", "patch", "delete")

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "RFC 9457 problem details; `type` is a stable slug (see docs/api.md).",
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "request_id": {"type": "string"},
        "errors": {"type": "object", "additionalProperties": True},
    },
    "required": ["type", "title", "status", "detail"],
    "additionalProperties": True,
}

IDEMPOTENCY_PARAMETER: dict[str, Any] = {
    "in": "header",
    "name": "Idempotency-Key",
    "required": True,
    "description": "Unique per intended effect (e.g. a UUID). Same key + same request replays "
    "the stored response; same key + different request is 422.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
}


def add_problem_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict:
    """Postprocessing hook: a `default` problem response everywhere, Idempotency-Key on writes."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    ref = {"$ref": "#/components/schemas/Problem"}
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        for method, operation in operations.items():
            if method not in ("get", *MUTATING):
                continue
            responses = operation.setdefault("responses", {})
            responses["default"] = {
                "description": "Error (problem details)",
                "content": {PROBLEM_CONTENT_TYPE: {"schema": ref}},
            }
            if method in MUTATING:
                params = operation.setdefault("parameters", [])
                if not any(p.get("name") == "Idempotency-Key" for p in params):
                    params.append(dict(IDEMPOTENCY_PARAMETER))
    return result
