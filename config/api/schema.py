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
    for name, component in schemas.items():
        # Request bodies reject unknown fields (StrictSerializer), and say so.
        if name.endswith("Request") and component.get("type") == "object":
            component["additionalProperties"] = False
    ref = {"$ref": "#/components/schemas/Problem"}
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/api/v1/"):
            continue
        client_api = not path.startswith("/api/v1/agent/")  # the agent protocol has its own rules
        for method, operation in operations.items():
            if method not in ("get", *MUTATING):
                continue
            responses = operation.setdefault("responses", {})
            responses["default"] = {
                "description": "Error (problem details)",
                "content": {PROBLEM_CONTENT_TYPE: {"schema": ref}},
            }
            if method in MUTATING and client_api:
                params = operation.setdefault("parameters", [])
                if not any(p.get("name") == "Idempotency-Key" for p in params):
                    params.append(dict(IDEMPOTENCY_PARAMETER))
    return result


def _fleet_enums() -> dict[str, Any]:
    """Names that exist now (GPU types, priority classes, regions), so clients see valid values."""
    from accounts.models import Region
    from scheduling.models import GpuType, PriorityClass

    try:
        return {
            "gpu_types": sorted(GpuType.objects.values_list("name", flat=True)),
            "max_memory": max(GpuType.objects.values_list("memory_gb", flat=True), default=None),
            "priority_classes": sorted(PriorityClass.objects.values_list("name", flat=True)),
            "regions": sorted(Region.objects.values_list("code", flat=True)),
        }
    except Exception:  # generated without a usable database (e.g. `manage.py spectacular`)
        return {}


def add_fleet_enums(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict:
    """Postprocessing hook: enumerate the GPU types, priority classes and regions that exist."""
    return apply_fleet_enums(result, _fleet_enums())


def apply_fleet_enums(result: dict[str, Any], enums: dict[str, Any]) -> dict[str, Any]:
    """Add the names that exist now. `gpu_types` keeps the serializer's `maxItems` (8): with
    `uniqueItems` and the enum a fleet of fewer types already bounds a valid list, and lowering
    the stated limit to the fleet's size made the schema disagree with the docs and validation."""
    schemas = result.get("components", {}).get("schemas", {})
    job = schemas.get("JobSubmitRequest", {}).get("properties", {})
    if job and enums.get("gpu_types"):
        job["gpu_types"]["items"]["enum"] = enums["gpu_types"]
        job["gpu_types"]["uniqueItems"] = True
    if job and enums.get("max_memory") is not None:
        job["gpu_memory_gb"]["maximum"] = enums["max_memory"]
    if job and enums.get("priority_classes"):
        job["priority_class"]["enum"] = enums["priority_classes"]
    if enums.get("regions"):
        if job:
            job["regions"]["items"]["enum"] = enums["regions"]
            job["regions"]["uniqueItems"] = True
        org = schemas.get("OrganizationCreateRequest", {}).get("properties", {})
        if org:
            org["home_region"]["enum"] = enums["regions"]
    return result
