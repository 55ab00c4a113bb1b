"""Idempotent mutating requests (DESIGN.md §7).

One transaction per request: the (principal, key) record is inserted first — it is the first
lock of the lock order — then the effect runs, then the record is completed with the response.
All three commit together, so a stored response always describes a committed effect, and a
failed request (4xx/5xx) leaves nothing behind: its key may be retried.

A concurrent duplicate's `INSERT ... ON CONFLICT DO NOTHING` waits on the first transaction's
uncommitted row. When that commits, the duplicate reads the stored response and replays it; if
it aborts, the duplicate's insert wins and it runs the effect itself. A duplicate waits at most
`IDEMPOTENCY_LOCK_WAIT_MS` (PostgreSQL `lock_timeout`), then gets 409 `idempotency-key-in-flight`.
"""

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.models import IdempotencyRecord
from config import prepared
from config.api.errors import (
    IdempotencyKeyInFlight,
    IdempotencyKeyInvalid,
    IdempotencyKeyMissing,
    IdempotencyKeyReused,
)
from config.api.serializers import no_query
from ledger.retry import RETRYABLE_SQLSTATES, sqlstate_of

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
LOCK_NOT_AVAILABLE = "55P03"
MAX_KEY_LENGTH = 255
RETRIES = 4

Effect = Callable[..., tuple[int, Any]]


@dataclass(frozen=True, slots=True)
class StoredResponse:
    status: int
    body: Any


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), cls=DjangoJSONEncoder)


_DJANGO_DEFAULT = DjangoJSONEncoder().default
_STORE_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _stored_form(body: Any) -> tuple[str, Any]:
    """(text to store, the body every replay renders): `canonical_json` and back, via orjson."""
    try:
        out = orjson.dumps(body, default=_DJANGO_DEFAULT, option=_STORE_OPTIONS)
    except orjson.JSONEncodeError:  # e.g. integers beyond 64 bits: the stdlib path
        text = canonical_json(body)
        return text, json.loads(text)
    return out.decode(), orjson.loads(out)


def fingerprint(method: str, path: str, body: Any) -> str:
    """sha256 over (method, path, canonical JSON body): what "the same request" means."""
    payload = "\n".join([method.upper(), path, canonical_json(body)])
    return hashlib.sha256(payload.encode()).hexdigest()


def principal_of(request: Request) -> str:
    return f"user:{request.user.pk}"


def key_of(request: Request) -> str:
    """The mutating request's Idempotency-Key: the first thing every write route asks for.

    Its query comes first: a write route takes no query parameters, and one given is a 400
    naming it, as on the GET routes, before anything is claimed or changed (QA: `POST
    /orgs/{id}/credits?dry_run=1` issued the credits, `PUT .../budget?dry_run=1` set the budget).
    """
    no_query(request)
    key = request.headers.get(HEADER)
    if key is None:
        raise IdempotencyKeyMissing(f"Mutating requests need an {HEADER} header (e.g. a UUID).")
    if not key or len(key) > MAX_KEY_LENGTH or not key.isascii() or not key.isprintable():
        raise IdempotencyKeyInvalid(
            f"{HEADER} must be 1-{MAX_KEY_LENGTH} printable ASCII characters."
        )
    return key


# One prepared statement (config/prepared.py). It bounds the wait for a concurrent original with
# a transaction-local `lock_timeout` set before the row is inserted (`prev` is read first) and puts
# the previous value back in the final SELECT, which runs after the INSERT (it reads its result)
# and returns one row whether or not a row was inserted, so the statements after the claim (e.g.
# bucket locks) never inherit the short timeout. The row: the record's id (NULL when the key
# exists) and the transaction's `now()`.
_INSERT = """
WITH prev AS (
    SELECT current_setting('lock_timeout') AS lock_timeout, set_config('lock_timeout', %s, true)
), claimed AS (
    INSERT INTO accounts_idempotencyrecord
        (principal, key, fingerprint, state, created_at, expires_at)
    SELECT %s, %s, %s, 'in_flight', now(), now() + make_interval(secs => %s) FROM prev
    ON CONFLICT (principal, key) DO NOTHING
    RETURNING id
)
SELECT claimed.id, now(), set_config('lock_timeout', prev.lock_timeout, true)
FROM prev LEFT JOIN claimed ON true
"""


def _postgres() -> bool:
    return connection.vendor == "postgresql"


def _claim(principal: str, key: str, fp: str) -> tuple[int, datetime] | StoredResponse:
    """Insert the in-flight record (returns its id and the transaction's `now()`, which
    `config.clock.db_now` would read) or return the stored response to replay."""
    ttl = int(settings.IDEMPOTENCY_KEY_TTL_SECONDS)
    wait_ms = int(settings.IDEMPOTENCY_LOCK_WAIT_MS)
    if not _postgres():  # embedded SQLite: writers are serialized (IMMEDIATE transactions)
        now = timezone.now()
        record, created = IdempotencyRecord.objects.get_or_create(
            principal=principal, key=key,
            defaults={"fingerprint": fp, "created_at": now, "expires_at": now + timedelta(seconds=ttl)},
        )
        if created:
            return record.pk, now
    else:
        record_id, now, _ = prepared.execute(_INSERT, [str(wait_ms), principal, key, fp, ttl])
        if record_id is not None:
            return int(record_id), now
    existing = (
        IdempotencyRecord.objects.filter(principal=principal, key=key)
        .values_list("fingerprint", "state", "response_status", "response_body")
        .first()
    )
    if existing is None:  # reaped between the two statements: let the caller retry
        raise _Vanished
    stored_fp, state, status, body = existing
    if stored_fp != fp:
        raise IdempotencyKeyReused(
            f"{HEADER} {key!r} was already used for a different request.", key=key
        )
    if state != "done":  # not reachable while records commit with their effect; kept as a guard
        raise IdempotencyKeyInFlight(f"A request with {HEADER} {key!r} is still in flight.", key=key)
    return StoredResponse(status=int(status), body=body)


class _Vanished(Exception):
    pass


_COMPLETE = (
    "UPDATE accounts_idempotencyrecord SET state = 'done', response_status = %s, "
    "response_body = %s::jsonb WHERE id = %s"
)


def _complete_portable(record_id: int, status: int, body: Any,
                       deferred_writes: list[tuple[str, list[Any]]]) -> None:
    IdempotencyRecord.objects.filter(pk=record_id).update(
        state="done", response_status=status, response_body=body
    )
    with connection.cursor() as cursor:
        for sql, params in deferred_writes:
            cursor.execute(sql, params)


def _commit_inline() -> bool:
    """Whether the completion's round trip may carry the COMMIT too: PostgreSQL, and our atomic
    block is the outermost one (not inside a caller's or a test's transaction)."""
    return (
        bool(getattr(settings, "IDEMPOTENCY_COMMIT_INLINE", True))
        and connection.vendor == "postgresql"
        and len(connection.atomic_blocks) == 1
        and not connection.savepoint_ids
        and not connection.needs_rollback
    )


def _complete(record_id: int, status: int, body: Any,
              deferred_writes: list[tuple[str, list[Any]]],
              redact: Callable[[Any], Any] | None = None) -> Response:
    """Store the response in the claimed record (then run `deferred_writes`); the response.

    `redact(body)`: what to store and replay instead, when the first answer holds a secret that
    must not be kept (a new API key's): the first caller gets `body`, replays the redacted one.
    """
    # What we store is byte-for-byte what every replay will return.
    first = _stored_form(body)[1] if redact is not None else None
    text, body = _stored_form(redact(body) if redact is not None else body)
    answer = Response(body if first is None else first, status=status)
    if not _postgres():  # embedded SQLite: one statement at a time
        _complete_portable(record_id, status, body, deferred_writes)
        return answer
    sql, params = _COMPLETE, [status, text, record_id]
    for extra_sql, extra_params in deferred_writes:
        sql, params = f"{sql}; {extra_sql}", [*params, *extra_params]
    if _commit_inline():
        sql = f"{sql}; COMMIT"
    with connection.cursor() as cursor:
        # Client-side binding (as in _claim): the statements travel together.
        cursor.execute(sql, params)
    return answer


def _in_flight(key: str) -> IdempotencyKeyInFlight:
    return IdempotencyKeyInFlight(
        f"A request with {HEADER} {key!r} is still in flight; retry later.", key=key
    )


class _Declined(Exception):
    pass


# `attempt(principal, key, fingerprint)`: (record id, status, body), or None to decline.
Attempt = Callable[[str, str, str], "tuple[int, int, Any] | None"]


def run_in_one_statement(request: Request, attempt: Attempt) -> Response | None:
    """A mutating request's first try where one statement claims the key and runs the effect.

    `attempt` runs in a transaction opened here; it claims the (caller, key) record itself (as
    `_claim` would, record `in_flight`) together with the effect, and returns the record's id
    with the response, or None to decline (the key exists, or the effect wants the full path).
    The record is then completed and committed in one more round trip, exactly as in
    `run_idempotent`. None: declined, everything rolled back; run `run_idempotent` instead,
    which answers replays, conflicts and refusals. A claim that waited out
    `IDEMPOTENCY_LOCK_WAIT_MS` (SQLSTATE 55P03) is 409, as there.
    """
    if not _postgres():
        return None
    key = key_of(request)
    fp = fingerprint(request.method or "", request.path, request.data)
    try:
        with transaction.atomic():
            done = attempt(principal_of(request), key, fp)
            if done is None:
                raise _Declined
            record_id, status, body = done
            return _complete(record_id, status, body, [])
    except _Declined:
        return None
    except DatabaseError as error:
        if sqlstate_of(error) == LOCK_NOT_AVAILABLE:
            raise _in_flight(key) from error
        raise


def run_idempotent(
    request: Request, effect: Effect, *, deferred_writes: list[tuple[str, list[Any]]] | None = None,
    pass_now: bool = False, redact: Callable[[Any], Any] | None = None,
) -> Response:
    """Run `effect` at most once per (caller, Idempotency-Key); replay its stored response.

    `deferred_writes`: statements (sql, params) the effect appended to this list; they run in
    the same transaction, in the same round trip as the record's completion (after it).
    `pass_now`: call `effect(now)` with the transaction's `now()` (read with the claim).
    `redact`: see `_complete` (the stored and replayed body, without a secret).

    When this is the outermost transaction (PostgreSQL), that same round trip ends with the
    COMMIT: psycopg then finds the connection idle and Django's commit at the end of the atomic
    block sends nothing; on_commit hooks still run after it. A failing COMMIT (e.g. a deferred
    constraint) raises inside the block, which rolls back as before. This keeps an org's hot
    rows (locked by the effect) locked one round trip less.
    """
    key = key_of(request)
    fp = fingerprint(request.method or "", request.path, request.data)
    return _run(principal_of(request), key, fp, effect, deferred_writes, pass_now, redact)


def run_once(*, principal: str, key: str, body: Any, effect: Effect, path: str) -> tuple[int, Any, bool]:
    """`run_idempotent` for a write that is not an API request: a portal form posted with the
    hidden key it was shown with (config/form_keys.py), so the same form sent twice writes once.

    `principal` must not be an API caller's ("user:<id>"), whose keys they choose themselves.
    `body` (the form's fields) and `path` make the fingerprint: the same key with other fields is
    `IdempotencyKeyReused`. Returns (status, body, replayed); the stored body must hold no secret.
    """
    response = _run(principal, key, fingerprint("POST", path, body), effect, None, False, None)
    return response.status_code, response.data, response.headers.get(REPLAYED_HEADER) == "true"


def _run(principal: str, key: str, fp: str, effect: Effect,
         deferred_writes: list[tuple[str, list[Any]]] | None, pass_now: bool,
         redact: Callable[[Any], Any] | None) -> Response:
    for attempt in range(1, RETRIES + 1):
        try:
            with transaction.atomic():
                claimed = _claim(principal, key, fp)
                if isinstance(claimed, StoredResponse):
                    stored = claimed
                else:
                    if deferred_writes:
                        deferred_writes.clear()  # a retried attempt starts over
                    record_id, now = claimed
                    status, body = effect(now) if pass_now else effect()
                    return _complete(record_id, status, body, deferred_writes or [], redact)
            # jsonb reorders keys: re-canonicalize so replays are byte-identical to the original.
            replay = json.loads(canonical_json(stored.body))
            return Response(replay, status=stored.status, headers={REPLAYED_HEADER: "true"})
        except _Vanished:
            continue
        except DatabaseError as error:
            state = sqlstate_of(error)
            if state == LOCK_NOT_AVAILABLE:
                raise _in_flight(key) from error
            if state not in RETRYABLE_SQLSTATES or attempt == RETRIES:
                raise
            time.sleep(0.005 * 2**attempt)
    raise IdempotencyKeyInFlight(f"A request with {HEADER} {key!r} could not be claimed.", key=key)
