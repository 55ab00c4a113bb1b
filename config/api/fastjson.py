"""orjson-backed JSON parsing and rendering that produce exactly what the stdlib paths produce.

orjson is several times faster than `json` for our payloads, but it differs from it on a few
inputs, so each function falls back to the stdlib path there instead of changing behaviour:

- parsing: anything orjson refuses (malformed JSON, NaN/Infinity, lone surrogates, 1e400) is
  parsed again by `json`, so errors and accepted edge cases are exactly as before; integer
  literals of 19+ digits go to `json` directly (orjson would turn those beyond 64 bits into
  floats);
- rendering: datetimes, dates, times and dataclasses are passed to DRF's encoder (same text as
  before); whatever orjson cannot encode (integers beyond 64 bits, non-string keys) is rendered
  by DRF's own `JSONRenderer`; U+2028/U+2029 are escaped as DRF does. Out-of-range floats
  (NaN, infinity) are the one difference: orjson writes `null` where DRF raised (no API field
  is a float).
"""

import json
import re
from typing import Any

import orjson
from rest_framework import renderers
from rest_framework.utils.encoders import JSONEncoder

_LONG_INTEGER = re.compile(rb"\d{19}")
_DRF_DEFAULT = JSONEncoder().default
_RENDER_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def loads(raw: bytes, *, parse_constant: Any = None) -> Any:
    """`json.loads(raw.decode("utf-8"), parse_constant=...)`, via orjson when it agrees."""
    if not _LONG_INTEGER.search(raw):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass  # let `json` decide, with its own error message
    return json.loads(raw.decode("utf-8"), parse_constant=parse_constant)


def dumps(data: Any) -> bytes | None:
    """Compact UTF-8 JSON as DRF's JSONRenderer writes it, or None when orjson cannot encode it."""
    try:
        out = orjson.dumps(data, default=_DRF_DEFAULT, option=_RENDER_OPTIONS)
    except orjson.JSONEncodeError:
        return None
    if b"\xe2\x80\xa8" in out or b"\xe2\x80\xa9" in out:
        out = out.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
    return out


class FastJSONRenderer(renderers.JSONRenderer):
    """DRF's JSONRenderer output, rendered by orjson (compact, UTF-8: DRF's defaults)."""

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Any = None) -> bytes:
        if data is None:
            return b""
        fast = (self.compact and not self.ensure_ascii and self.strict
                and self.encoder_class is JSONEncoder
                and self.get_indent(accepted_media_type, renderer_context or {}) is None)
        if fast and (out := dumps(data)) is not None:
            return out
        return super().render(data, accepted_media_type, renderer_context)

