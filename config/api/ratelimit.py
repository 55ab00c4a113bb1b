"""Rate limits per API key and per organization, atomic in Redis (the `limits` library).

Limits are configured per route scope in `settings.API_RATE_LIMITS`:
`{"<scope>": {"key": "600/minute", "org": "3000/minute"}}`; a scope without an entry uses
`"default"`. The sliding-window counter runs as one Lua script in Redis, so concurrent web
workers never race; with no `REDIS_URL` (embedded mode) an in-memory storage is used.

A separate cap bounds the concurrent in-flight submissions of one organization
(`Organization.max_inflight_submissions`): a Redis sorted set of request tokens whose entries
expire on their own, so a crashed worker cannot leak a slot for longer than the TTL.
"""

import math
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

import redis
from django.conf import settings
from limits import RateLimitItem, parse
from limits.storage import storage_from_string
from limits.strategies import SlidingWindowCounterRateLimiter
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from config.api.errors import RateLimited
from config.telemetry import annotate_org


@lru_cache(maxsize=4)
def _limiter(url: str) -> SlidingWindowCounterRateLimiter:
    return SlidingWindowCounterRateLimiter(storage_from_string(url or "memory://"))


@lru_cache(maxsize=64)
def _item(spec: str) -> RateLimitItem:
    return parse(spec)


def _limit_for(scope: str, kind: str) -> str | None:
    table: dict[str, dict[str, str]] = settings.API_RATE_LIMITS
    return table.get(scope, {}).get(kind) or table.get("default", {}).get(kind)


def _namespace() -> str:
    # The cache's key prefix keeps concurrent test runs (and deployments sharing a Redis) apart.
    return str(settings.CACHES.get("default", {}).get("KEY_PREFIX", ""))


def hit(*, scope: str, kind: str, identity: str) -> None:
    """Count one request against `kind` ("key" | "org") of `scope`; raise RateLimited when over."""
    spec = _limit_for(scope, kind)
    if not spec:
        return
    limiter = _limiter(settings.REDIS_URL)
    item = _item(spec)
    ids = (f"api{_namespace()}", scope, kind, identity)
    if limiter.hit(item, *ids):
        return
    reset_at, _remaining = limiter.get_window_stats(item, *ids)
    retry_after = max(1, math.ceil(reset_at - time.time()))
    raise RateLimited(
        f"Rate limit {spec} per {kind} exceeded for {scope}; retry in {retry_after}s.",
        retry_after=retry_after, scope=scope, limit=spec,
    )


def principal_identity(request: Request) -> str:
    """The rate-limit identity of a caller: its API key, else its user (session)."""
    auth = request.auth
    if auth is not None and hasattr(auth, "pk"):
        return f"key:{auth.pk}"
    return f"user:{request.user.pk}"


def enforce_org_limit(request: Request, *, org_id: int, scope: str) -> None:
    annotate_org(org_id)  # every org-scoped view passes here: tag its span and log lines
    hit(scope=scope, kind="org", identity=f"org:{org_id}")


class ApiKeyRateThrottle(BaseThrottle):
    """DRF throttle: per API key (or session user), scope from the view's `rate_limit_scope`."""

    def allow_request(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return True
        hit(scope=getattr(view, "rate_limit_scope", "default"), kind="key",
            identity=principal_identity(request))
        return True


# --- concurrent in-flight submissions per org -------------------------------------------------

@lru_cache(maxsize=4)
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


_local_slots: dict[str, set[str]] = {}
_local_lock = threading.Lock()


@contextmanager
def inflight_slot(*, org_id: int, cap: int) -> Iterator[None]:
    """Hold one of `cap` concurrent submission slots of an org for the duration of the block."""
    key = f"api{_namespace()}:inflight:org:{org_id}"
    token = uuid.uuid4().hex
    ttl = settings.API_INFLIGHT_TTL_SECONDS
    url = settings.REDIS_URL
    if url:
        client = _redis(url)
        now = time.time()
        pipe = client.pipeline(transaction=True)
        pipe.zremrangebyscore(key, "-inf", now - ttl)
        pipe.zadd(key, {token: now})
        pipe.zcard(key)
        pipe.expire(key, ttl)
        count = pipe.execute()[2]
    else:
        with _local_lock:
            slots = _local_slots.setdefault(key, set())
            slots.add(token)
            count = len(slots)
    try:
        if count > cap:
            raise RateLimited(
                f"The organization already has {cap} submissions in flight; retry shortly.",
                retry_after=1, scope="inflight-submissions", limit=str(cap),
            )
        yield
    finally:
        if url:
            _redis(url).zrem(key, token)
        else:
            with _local_lock:
                _local_slots.get(key, set()).discard(token)
