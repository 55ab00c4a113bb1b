"""Hash-chain arithmetic for audit events (pure: no database)."""

import hashlib
import json
from datetime import datetime
from typing import Any

GENESIS = "0" * 64


def event_digest(*, prev_hash: str, chain: str, seq: int, fields: dict[str, Any]) -> str:
    """SHA-256 over the predecessor's hash and a canonical JSON of the event's content."""
    payload = {"prev": prev_hash, "chain": chain, "seq": seq, **fields}
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=_jsonable)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _jsonable(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON-serializable in an audit event: {type(value).__name__}")
