"""Fallback API view: unknown `/api/v1/` paths answer with problem details."""

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from config.api.exceptions import PROBLEM_CONTENT_TYPE
from config.request_context import current_request_id


@csrf_exempt  # no state changes here; a CSRF 403 page would hide the 404 problem document
def api_not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    body = {"type": "not-found", "title": "Not found", "status": 404,
            "detail": "No such API route.", "instance": request.path, "request_id": current_request_id()}
    return JsonResponse(body, status=404, content_type=PROBLEM_CONTENT_TYPE)
