"""API key format and hashing: `gpub_<prefix>_<secret>`; only SHA-256 of the whole key is kept."""

import hashlib
import secrets

KEY_PREFIX = "gpub"


def hash_key(raw: str) -> str:
    # Keys are 256-bit random, so a fast hash is enough (no dictionary attack is possible).
    return hashlib.sha256(raw.encode()).hexdigest()


def new_key() -> tuple[str, str]:
    """Return (raw key, lookup prefix)."""
    prefix = secrets.token_hex(6)
    return f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}", prefix


def parse_prefix(raw: str) -> str | None:
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1]:
        return None
    return parts[1]
