"""Hash-chain arithmetic for audit events (pure: no database).

Two hash formats, recorded per event in `AuditEvent.hash_format`:

1. `event_digest`: SHA-256 over Python's canonical JSON (sorted keys, no spaces) of the
   predecessor's hash, chain, seq and content; computed in Python by `audit.services`.
2. `event_digest_v2`: SHA-256 over the UTF-8 text of a PostgreSQL `jsonb` object holding
   `v` (= 2), the predecessor's hash, chain, seq, `created_at` as integer microseconds since
   the Unix epoch, and the content fields. The ledger's SQL functions compute it in the
   database (`sha256(convert_to(jsonb_build_object(...)::text, 'UTF8'))`, see
   ledger/migrations/0005_hot_path_functions.py) so an operation and its event are written by
   one statement; `jsonb_text` reproduces PostgreSQL's jsonb output here, so verification
   needs no database.
"""

import hashlib
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

GENESIS = "0" * 64
HASH_V1 = 1
HASH_V2 = 2
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def event_digest(*, prev_hash: str, chain: str, seq: int, fields: dict[str, Any]) -> str:
    """SHA-256 over the predecessor's hash and a canonical JSON of the event's content."""
    payload = {"prev": prev_hash, "chain": chain, "seq": seq, **fields}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=_jsonable)
    return hashlib.sha256(canonical.encode()).hexdigest()


def event_digest_v2(*, prev_hash: str, chain: str, seq: int, fields: dict[str, Any]) -> str:
    """Format 2: SHA-256 over PostgreSQL's jsonb text of the event (see the module docstring)."""
    created_at = fields["created_at"]
    payload = {
        **fields,
        "v": HASH_V2,
        "prev": prev_hash,
        "chain": chain,
        "seq": seq,
        "created_at": (created_at - _EPOCH) // _MICROSECOND,
    }
    return hashlib.sha256(jsonb_text(payload).encode()).hexdigest()


def digest_for(hash_format: int, *, prev_hash: str, chain: str, seq: int, fields: dict[str, Any]) -> str:
    if hash_format == HASH_V2:
        return event_digest_v2(prev_hash=prev_hash, chain=chain, seq=seq, fields=fields)
    if hash_format == HASH_V1:
        return event_digest(prev_hash=prev_hash, chain=chain, seq=seq, fields=fields)
    raise ValueError(f"unknown audit hash format {hash_format!r}")


def jsonb_text(value: Any) -> str:
    """`value::jsonb::text` as PostgreSQL prints it: object keys ordered by byte length, then
    bytes; `", "` and `": "` separators; numbers as `numeric` prints them; strings escaped like
    PostgreSQL's `escape_json` (non-ASCII characters as themselves)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        # numeric keeps the decimal digits of the JSON text (Python's shortest repr), scale >= 0.
        return format(Decimal(repr(value)), "f")
    if isinstance(value, str):
        return _jsonb_string(value)
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return "{" + ", ".join(f"{_jsonb_string(k)}: {jsonb_text(value[k])}" for k in keys) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(jsonb_text(v) for v in value) + "]"
    raise TypeError(f"not JSON-serializable in an audit event: {type(value).__name__}")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _jsonb_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ch < " ":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _jsonable(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON-serializable in an audit event: {type(value).__name__}")
