"""Content negotiation whose unknown `?format=` is a 400 naming the parameter, not DRF's 404.

DRF answers a `format` no renderer of the route offers with Http404, which reads as "this object
does not exist" (QA: `?format=cvs` on an org's statement said the org was not found)."""

from __future__ import annotations

from typing import Any

from django.http import Http404
from rest_framework.exceptions import ValidationError
from rest_framework.negotiation import DefaultContentNegotiation


class FormatIsAParameter(DefaultContentNegotiation):
    def select_renderer(self, request: Any, renderers: Any, format_suffix: Any = None) -> Any:
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except Http404:
            offered = " or ".join(sorted({r.format for r in renderers}))
            asked = request.query_params.get("format")
            raise ValidationError({"format": [f"This route answers as {offered}, not {asked!r}."]}) from None
