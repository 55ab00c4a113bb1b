"""API fallbacks: unknown `/api/v1/` paths and unhandled errors answer with problem details."""

import sys
from typing import Any

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt

from config.api.exceptions import PROBLEM_CONTENT_TYPE
from config.request_context import current_request_id


def _problem(request: HttpRequest, *, type_: str, title: str, status: int, detail: str) -> JsonResponse:
    body = {"type": type_, "title": title, "status": status, "detail": detail,
            "instance": request.path, "request_id": current_request_id()}
    # Compact, like the API's own renderer (QA: this body alone had spaces after separators).
    return JsonResponse(body, status=status, content_type=PROBLEM_CONTENT_TYPE,
                        json_dumps_params={"separators": (",", ":")})


@csrf_exempt  # no state changes here; a CSRF 403 page would hide the 404 problem document
def api_not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    return _problem(request, type_="not-found", title="Not found", status=404, detail="No such API route.")


def server_error(request: HttpRequest) -> HttpResponse:
    """`handler500`. Django has already logged the error (and sent `got_request_exception`) and
    rolled back any open transaction. API paths answer with problem details: 503
    `database-unavailable` (with `Retry-After`) when PostgreSQL could not be reached or gave up
    on the statement, else 500 `internal-error` carrying the request id to quote. Other paths
    get Django's page."""
    if not request.path.startswith("/api/"):
        return defaults.server_error(request)
    if isinstance(sys.exc_info()[1], OperationalError | InterfaceError):
        response = _problem(request, type_="database-unavailable", title="Database unavailable",
                            status=503, detail="The database is unavailable or busy; retry shortly.")
        response["Retry-After"] = "1"
        return response
    return _problem(request, type_="internal-error", title="Internal error", status=500,
                    detail="An unexpected error occurred; quote the request_id when reporting it.")
