"""Rate limits per API key and per organization, atomic in Redis (the `limits` library).

Limits are configured per route scope in `settings.API_RATE_LIMITS`:
`{"<scope>": {"key": "600/minute", "org": "3000/minute"}}`; a scope without an entry uses
`"default"`. The sliding-window counter runs as one Lua script in Redis, so concurrent web
workers never race; with no `REDIS_URL` (embedded mode) an in-memory storage is used.

A separate cap bounds the concurrent in-flight submissions of one organization
(`Organization.max_inflight_submissions`): a Redis sorted set of request tokens whose entries
expire on their own, so a crashed worker cannot leak a slot for longer than the TTL.

Job submission (`submission_gate`) takes its per-key limit, its per-org limit and the in-flight
slot in ONE Redis round trip: a Lua script (registered once) that runs the `limits` library's
sliding-window acquisition on the library's own keys for each limit in turn — a later limit is
not charged when an earlier one refuses, as with separate calls — and then claims the slot.
The whole script is atomic in Redis, so each limit stays atomic across web workers.
"""

import logging
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
from limits.errors import StorageError
from limits.storage import storage_from_string
from limits.strategies import SlidingWindowCounterRateLimiter
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from config.api.errors import RateLimited, RateLimiterUnavailable
from config.telemetry import annotate_org

logger = logging.getLogger(__name__)
_STORE_ERRORS = (redis.RedisError, StorageError)


@contextmanager
def _store() -> Iterator[None]:
    """Around each call that takes a limit or a slot: an unreachable (or failing) Redis answers
    503 `rate-limiter-unavailable` before anything is written, instead of an unhandled error."""
    try:
        yield
    except _STORE_ERRORS as error:
        logger.warning("rate limiter unavailable: %r", error)
        raise RateLimiterUnavailable("The rate limiter is unavailable; retry shortly.") from error


def _release(client: redis.Redis, key: str, token: str) -> None:
    """Give an in-flight slot back. Runs after the request's work (possibly committed), so a
    failure must not turn its answer into an error: the slot then expires after
    `API_INFLIGHT_TTL_SECONDS` (every claim first drops expired slots)."""
    try:
        client.zrem(key, token)
    except _STORE_ERRORS as error:
        logger.warning("in-flight slot %s of %s not released (expires on its own): %r", token, key, error)


def _timeouts(seconds: float) -> dict[str, float]:
    return {"socket_connect_timeout": seconds, "socket_timeout": seconds}


def _limiter(url: str) -> SlidingWindowCounterRateLimiter:
    return _limiter_with(url, float(settings.API_REDIS_TIMEOUT_SECONDS))


@lru_cache(maxsize=4)
def _limiter_with(url: str, timeout: float) -> SlidingWindowCounterRateLimiter:
    if not url:
        return SlidingWindowCounterRateLimiter(storage_from_string("memory://"))
    return SlidingWindowCounterRateLimiter(storage_from_string(url, **_timeouts(timeout)))


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
    with _store():
        if limiter.hit(item, *ids):
            return
        refusal = _refuse(spec, kind, scope, item, ids)
    raise refusal


def _refuse(spec: str, kind: str, scope: str, item: RateLimitItem, ids: tuple[str, ...]) -> RateLimited:
    reset_at, _remaining = _limiter(settings.REDIS_URL).get_window_stats(item, *ids)
    retry_after = max(1, math.ceil(reset_at - time.time()))
    return RateLimited(
        f"Rate limit {spec} per {'user' if kind == 'key' else kind} exceeded for {scope}; "
        f"retry in {retry_after}s.",
        retry_after=retry_after, scope=scope, limit=spec,
    )


def principal_identity(request: Request) -> str:
    """The rate-limit identity of a caller: its user, whichever of their API keys or their browser
    session it comes with (review: limits counted per key, so a user who made more keys got that
    many times the limit). The settings still call this level `key`."""
    return f"user:{request.user.pk}"


def enforce_org_limit(request: Request, *, org_id: int, scope: str) -> None:
    annotate_org(org_id)  # every org-scoped view passes here: tag its span and log lines
    hit(scope=scope, kind="org", identity=f"org:{org_id}")


class ApiKeyRateThrottle(BaseThrottle):
    """DRF throttle: per user (all their keys and session), scope from the view's `rate_limit_scope`."""

    def allow_request(self, request: Request, view: Any) -> bool:
        if not request.user or not request.user.is_authenticated:
            return True
        if getattr(view, "key_limit_in_view", False) and request.method == "POST":
            return True  # the view charges it itself (`submission_gate`, or `hit` on a refusal)
        hit(scope=getattr(view, "rate_limit_scope", "default"), kind="key",
            identity=principal_identity(request))
        return True


# --- concurrent in-flight submissions per org -------------------------------------------------

def _redis(url: str) -> redis.Redis:
    return _redis_with(url, float(settings.API_REDIS_TIMEOUT_SECONDS))


@lru_cache(maxsize=4)
def _redis_with(url: str, timeout: float) -> redis.Redis:
    return redis.Redis.from_url(url, **_timeouts(timeout))


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
        with _store():
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
            _release(_redis(url), key, token)
        else:
            with _local_lock:
                _local_slots.get(key, set()).discard(token)


# --- submission: both limits and the in-flight slot in one round trip ---------------------------

# KEYS: (previous, current) window keys per limit, then the in-flight set.
# ARGV: number of limits, (limit, expiry seconds) per limit, then token, now, ttl.
# Returns {index of the refusing limit (1-based) or 0, in-flight count (0 when refused)}.
# The per-limit block is the `limits` library's acquire_sliding_window.lua (amount 1).
_GATE_LUA = """
local n = tonumber(ARGV[1])
for i = 1, n do
    local prev_key, cur_key = KEYS[2 * i - 1], KEYS[2 * i]
    local limit = tonumber(ARGV[2 * i])
    local expiry = tonumber(ARGV[2 * i + 1]) * 1000
    if 1 > limit then return {i, 0} end
    local current_ttl = tonumber(redis.call('pttl', cur_key))
    if current_ttl > 0 and current_ttl < expiry then
        redis.call('rename', cur_key, prev_key)
        redis.call('set', cur_key, 0, 'PX', current_ttl + expiry)
    end
    local previous_count = tonumber(redis.call('get', prev_key)) or 0
    local previous_ttl = tonumber(redis.call('pttl', prev_key)) or 0
    local current_count = tonumber(redis.call('get', cur_key)) or 0
    current_ttl = tonumber(redis.call('pttl', cur_key)) or 0
    if previous_ttl <= 0 then previous_ttl = 0 end
    if current_ttl <= 0 then current_ttl = 0 end
    local weighted = math.floor(previous_count * previous_ttl / expiry) + current_count
    if (weighted + 1) > limit then return {i, 0} end
    if redis.call('exists', cur_key) == 1 then
        redis.call('incrby', cur_key, 1)
    else
        redis.call('set', cur_key, 1, 'PX', expiry * 2)
    end
end
local slots = KEYS[2 * n + 1]
local token, now, ttl = ARGV[2 * n + 2], tonumber(ARGV[2 * n + 3]), tonumber(ARGV[2 * n + 4])
redis.call('zremrangebyscore', slots, '-inf', now - ttl)
redis.call('zadd', slots, ARGV[2 * n + 3], token)
local count = redis.call('zcard', slots)
redis.call('expire', slots, ttl)
return {0, count}
"""


def _gate_script(url: str) -> Any:
    return _gate_script_on(_limiter(url).storage)


@lru_cache(maxsize=4)
def _gate_script_on(storage: Any) -> Any:
    return storage.get_connection().register_script(_GATE_LUA)


def _too_many_inflight(cap: int) -> RateLimited:
    return RateLimited(
        f"The organization already has {cap} submissions in flight; retry shortly.",
        retry_after=1, scope="inflight-submissions", limit=str(cap),
    )


@contextmanager
def submission_gate(request: Request, *, org_id: int, cap: int, scope: str) -> Iterator[None]:
    """Per-key limit, per-org limit and one in-flight slot for the block, in one round trip.

    Same order and effect as the throttle's `hit(kind="key")`, `enforce_org_limit` and
    `inflight_slot`: a refused limit charges no later one and takes no slot.
    """
    annotate_org(org_id)
    url = settings.REDIS_URL
    if not url:  # embedded mode: the in-memory limiter, one call each
        hit(scope=scope, kind="key", identity=principal_identity(request))
        hit(scope=scope, kind="org", identity=f"org:{org_id}")
        with inflight_slot(org_id=org_id, cap=cap):
            yield
        return
    storage = _limiter(url).storage
    limits: list[tuple[str, str, RateLimitItem, tuple[str, ...]]] = []
    for kind, identity in (("key", principal_identity(request)), ("org", f"org:{org_id}")):
        if spec := _limit_for(scope, kind):
            ids = (f"api{_namespace()}", scope, kind, identity)
            limits.append((spec, kind, _item(spec), ids))
    keys: list[str] = []
    args: list[Any] = [len(limits)]
    for _spec, _kind, item, ids in limits:
        base = item.key_for(*ids)
        keys += [storage.prefixed_key(storage._previous_window_key(base)),
                 storage.prefixed_key(storage._current_window_key(base))]
        args += [item.amount, item.get_expiry()]
    slots = f"api{_namespace()}:inflight:org:{org_id}"
    token = uuid.uuid4().hex
    ttl = settings.API_INFLIGHT_TTL_SECONDS
    with _store():
        refused, count = _gate_script(url)(keys=[*keys, slots], args=[*args, token, repr(time.time()), ttl])
        if refused:
            spec, kind, item, ids = limits[int(refused) - 1]
            refusal = _refuse(spec, kind, scope, item, ids)
    if refused:
        raise refusal
    try:
        if int(count) > cap:
            raise _too_many_inflight(cap)
        yield
    finally:
        _release(_redis(url), slots, token)
