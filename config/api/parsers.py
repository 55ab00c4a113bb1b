"""A JSON parser that caps the body size before reading it (absurd payloads -> 400)."""

from typing import Any

from django.conf import settings
from rest_framework import parsers
from rest_framework.exceptions import ParseError

from config.api import fastjson
from config.api.errors import PayloadTooLarge


class BoundedJSONParser(parsers.JSONParser):
    """Strict JSON (no NaN/Infinity), at most `API_MAX_BODY_BYTES` bytes (parsed by orjson)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit: int = settings.API_MAX_BODY_BYTES
        request = (parser_context or {}).get("request")
        declared = request.META.get("CONTENT_LENGTH") if request is not None else None
        if declared and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLarge(f"The request body exceeds {limit} bytes.", max_bytes=limit)
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise PayloadTooLarge(f"The request body exceeds {limit} bytes.", max_bytes=limit)
        try:
            return fastjson.loads(raw, parse_constant=_reject_constant)
        except (ValueError, UnicodeDecodeError) as error:
            raise ParseError(f"Malformed JSON: {error}") from error
        except RecursionError as error:  # past orjson's depth limit, then the stdlib's (QA: a 500)
            raise ParseError("Malformed JSON: nested too deeply.") from error


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")
