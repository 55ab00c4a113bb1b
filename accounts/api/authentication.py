"""`Authorization: Bearer <api key>` authentication for DRF.

The key row (with its user and the user's finance flag) is cached per process for
`API_KEY_CACHE_SECONDS` (default 5 s), so a busy client costs one statement per key per process
every few seconds instead of one per request. What that means for changes to a key:

- expiry is exact: `expires_at` is checked on every request against the clock;
- revocation through `revoke_api_key` (API, admin) is immediate in the revoking process (its
  entry is dropped) and takes at most `API_KEY_CACHE_SECONDS` in every other process; the same
  window applies to a deactivated user, a changed finance group, or a deleted key;
- the secret is still verified on every request (SHA-256 of the presented key vs the cached
  hash), and only keys that verified are cached (unknown prefixes are never cached).

`last_used_at` is written at most once a minute per key (`API_KEY_TOUCH_SECONDS`): a process
remembers when it last touched a key, queues it, and writes the queue in one conditional UPDATE
after the response is sent (`request_finished`), leaving a row touched less than a minute ago (by
any process) alone — no write per request, and no request waits for one.
"""

import hmac
import logging
import threading
import time
from datetime import timedelta
from functools import cache
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.signals import request_finished
from django.db import DatabaseError, connection, transaction
from django.db.models import Q
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from accounts.keys import hash_key, parse_prefix
from accounts.models import ApiKey
from accounts.selectors import FINANCE_GROUP
from config.clock import aware_row

logger = logging.getLogger(__name__)
_MAX_CACHED = 4096
_cached: dict[str, tuple[float, tuple[Any, ...]]] = {}  # prefix -> (loaded at, monotonic; row)
_touched: dict[int, float] = {}  # key id -> when this process last wrote its last_used_at
_touch_lock = threading.Lock()


@cache
def _lookup_sql() -> tuple[str, list[str], list[str]]:
    user_model = get_user_model()
    key_fields = [f.attname for f in ApiKey._meta.concrete_fields]
    user_fields = [f.attname for f in user_model._meta.concrete_fields]
    through = user_model._meta.get_field("groups").remote_field.through._meta.db_table
    key_cols = ", ".join(f'k."{f.column}"' for f in ApiKey._meta.concrete_fields)
    user_cols = ", ".join(f'u."{f.column}"' for f in user_model._meta.concrete_fields)
    sql = (
        f"SELECT {key_cols}, {user_cols}, "  # noqa: S608 (identifiers from model metadata)
        f"EXISTS (SELECT 1 FROM {through} ug JOIN {Group._meta.db_table} g ON g.id = ug.group_id "
        "WHERE ug.user_id = u.id AND g.name = %s) "
        f"FROM {ApiKey._meta.db_table} k JOIN {user_model._meta.db_table} u ON u.id = k.user_id "
        "WHERE k.prefix = %s ORDER BY k.id LIMIT 1"
    )
    return sql, key_fields, user_fields


def _fetch(prefix: str) -> tuple[Any, ...] | None:
    """The key, its user and the user's finance flag, in one statement (plain SQL: on the
    submission path the ORM's query compilation cost more than the query)."""
    sql, _key_fields, _user_fields = _lookup_sql()
    with connection.cursor() as cursor:
        cursor.execute(sql, [FINANCE_GROUP, prefix])
        row = cursor.fetchone()
    return aware_row(row) if row is not None else None


def _build(row: tuple[Any, ...]) -> ApiKey:
    """Fresh model instances per request (a cached row is shared; instances never are)."""
    _sql, key_fields, user_fields = _lookup_sql()
    n = len(key_fields)
    key = ApiKey.from_db(connection.alias, key_fields, row[:n])
    user = get_user_model().from_db(connection.alias, user_fields, row[n:n + len(user_fields)])
    user._gpubank_is_finance = bool(user.is_superuser or row[-1])  # read by accounts.selectors.is_finance
    ApiKey._meta.get_field("user").set_cached_value(key, user)
    return key


def _lookup(prefix: str, key_hash: str) -> ApiKey | None:
    """The key whose prefix and hash match, from this process's cache when fresh enough."""
    ttl = float(getattr(settings, "API_KEY_CACHE_SECONDS", 5.0))
    now = time.monotonic()
    entry = _cached.get(prefix)
    if entry is not None and now - entry[0] < ttl:
        row = entry[1]
        hash_at = _lookup_sql()[1].index("key_hash")
        return _build(row) if hmac.compare_digest(row[hash_at], key_hash) else None
    row = _fetch(prefix)
    if row is None:
        _cached.pop(prefix, None)
        return None
    key = _build(row)
    if not hmac.compare_digest(key.key_hash, key_hash):
        return None
    if ttl > 0:
        if len(_cached) >= _MAX_CACHED:
            _cached.clear()
        _cached[prefix] = (now, row)
    return key


def forget_api_key(prefix: str) -> None:
    """Drop a key from this process's cache (revocation takes effect here at once)."""
    _cached.pop(prefix, None)


_pending: set[int] = set()  # keys used since their last write, written when a response is done


def _touch(key: ApiKey) -> None:
    """Record use: at most once per key per process per minute, the key is queued for a
    `last_used_at` write that runs after the response is sent (`request_finished`), so no
    request waits for that write and its commit."""
    every = float(getattr(settings, "API_KEY_TOUCH_SECONDS", 60.0))
    now = time.monotonic()
    last = _touched.get(key.pk)
    if last is not None and now - last < every:
        return
    with _touch_lock:
        last = _touched.get(key.pk)
        if last is not None and now - last < every:
            return
        if len(_touched) >= _MAX_CACHED:
            _touched.clear()
        _touched[key.pk] = now
        _pending.add(key.pk)


def flush_key_touches(**_kwargs: Any) -> None:
    """Write the queued `last_used_at`s in one UPDATE; a row touched less than a minute ago (by
    any process) is left alone. Connected to `request_finished` (after the response is sent)."""
    if not _pending:
        return
    with _touch_lock:
        ids = sorted(_pending)
        _pending.clear()
    every = float(getattr(settings, "API_KEY_TOUCH_SECONDS", 60.0))
    at = timezone.now()
    try:
        with transaction.atomic():  # a savepoint if some caller's transaction is open
            ApiKey.objects.filter(pk__in=ids).filter(
                Q(last_used_at__isnull=True) | Q(last_used_at__lt=at - timedelta(seconds=every))
            ).update(last_used_at=at)
    except DatabaseError:  # informational only: never fail (or poison) the finished request
        logger.warning("could not record API key use", exc_info=True)


request_finished.connect(flush_key_touches, dispatch_uid="accounts.api_key_touches")


class ApiKeyAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        # The scheme is case-insensitive (RFC 7235 §2.1; QA: `bearer <key>` was answered
        # "credentials were not provided").
        if scheme.lower() != self.keyword.lower():
            return None
        raw = raw.strip()
        prefix = parse_prefix(raw)
        if prefix is None:
            raise exceptions.AuthenticationFailed("Malformed API key.")
        key = _lookup(prefix, hash_key(raw))
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid API key.")
        now = timezone.now()
        if key.revoked_at is not None:
            raise exceptions.AuthenticationFailed("API key revoked.")
        if key.expires_at is not None and key.expires_at <= now:
            raise exceptions.AuthenticationFailed("API key expired.")
        if not key.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive.")
        _touch(key)
        return key.user, key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
