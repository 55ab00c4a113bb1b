"""Render every API error as RFC 9457 problem details (`application/problem+json`)."""

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response

from config.errors import DomainError
from config.request_context import current_request_id

PROBLEM_CONTENT_TYPE = "application/problem+json"

# DRF exception class -> (stable type, title). Checked in order (subclasses first).
_DRF_TYPES: list[tuple[type[exceptions.APIException], str, str]] = [
    (exceptions.ValidationError, "validation-error", "Invalid request"),
    (exceptions.ParseError, "validation-error", "Malformed request body"),
    (exceptions.NotAuthenticated, "unauthenticated", "Authentication required"),
    (exceptions.AuthenticationFailed, "unauthenticated", "Authentication failed"),
    (exceptions.PermissionDenied, "permission-denied", "Permission denied"),
    (exceptions.NotFound, "not-found", "Not found"),
    (exceptions.MethodNotAllowed, "method-not-allowed", "Method not allowed"),
    (exceptions.NotAcceptable, "not-acceptable", "Not acceptable"),
    (exceptions.UnsupportedMediaType, "unsupported-media-type", "Unsupported media type"),
    (exceptions.Throttled, "rate-limited", "Rate limit exceeded"),
]


def problem_response(
    *, type_: str, title: str, status: int, detail: str, extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None, instance: str = "",
) -> Response:
    body: dict[str, Any] = {"type": type_, "title": title, "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    if rid := current_request_id():
        body["request_id"] = rid
    body.update(extra or {})
    return Response(body, status=status, headers=headers, content_type=PROBLEM_CONTENT_TYPE)


def _flatten_detail(detail: Any) -> str:
    if isinstance(detail, list | tuple):
        return " ".join(_flatten_detail(d) for d in detail)
    if isinstance(detail, dict):
        return " ".join(f"{k}: {_flatten_detail(v)}" for k, v in detail.items())
    return str(detail)


def _field_errors(detail: Any) -> dict[str, Any]:
    if isinstance(detail, dict):
        return {k: _as_messages(v) for k, v in detail.items()}
    return {"non_field_errors": _as_messages(detail)}


def _as_messages(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _as_messages(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_as_messages(v) for v in value]
    return str(value)


def problem_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: DomainError and DRF/Django errors -> problem details."""
    request = context.get("request")
    instance = request.path if request is not None else ""
    if isinstance(exc, DomainError):
        retry_after = getattr(exc, "retry_after", None)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return problem_response(
            type_=exc.type, title=exc.title, status=exc.status, detail=exc.detail,
            extra=dict(exc.extra), headers=headers, instance=instance,
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    if not isinstance(exc, exceptions.APIException):
        return None
    type_, title = "error", "Request failed"
    for cls, slug, name in _DRF_TYPES:
        if isinstance(exc, cls):
            type_, title = slug, name
            break
    extra: dict[str, Any] = {}
    headers: dict[str, str] = {}
    if isinstance(exc, exceptions.ValidationError):
        extra["errors"] = _field_errors(exc.detail)
        detail = "The request has invalid fields."
    else:
        detail = _flatten_detail(exc.detail)
    if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
        headers["Retry-After"] = str(max(1, int(exc.wait + 0.999)))
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        view = context.get("view")
        auth_header = view.get_authenticate_header(request) if view and request else None
        exc.status_code = 401
        if auth_header:
            headers["WWW-Authenticate"] = auth_header
    return problem_response(
        type_=type_, title=title, status=exc.status_code, detail=detail, extra=extra,
        headers=headers or None, instance=instance,
    )
