"""The PostgreSQL hot path: place a hold, capture, release a hold -- one function call each.

`ledger_place_hold`, `ledger_capture` and `ledger_release_hold` (ledger/migrations/0005, 0006)
lock, re-read, decide, write the journal and append the audit event in one round trip, as
server-side prepared statements (docs/decisions/0003-ledger-hot-path-in-sql.md). The services in
`holds.py` / `settlement.py` stay the public entry points: they validate the input, call these
wrappers within `scope()` -- the caller's transaction (with a savepoint, as before) when nested,
else one autocommit statement -- under `retry_on_conflict`, and the wrappers turn a returned
status into the same typed errors as the Python decision path, which is still what runs on other
databases (the embedded SQLite mode) or with `ENABLED = False`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction

from config import metrics, prepared
from config.request_context import current_request_id
from ledger.clock import clock_offset
from ledger.errors import CaptureExceedsHold, HoldNotActive, InsufficientCredits
from ledger.locks import hold_from_row
from ledger.models import Hold, HoldState, LedgerTransaction, TransactionKind
from ledger.retry import sqlstate_of
from ledger.services._journal import CallerEvent, actor_fields, replay

# SQLSTATE of `ledger_place_hold`'s refusal (DETAIL: the available amount).
INSUFFICIENT_CREDITS = "GB402"

# A/B switch (benchmarks, tests): False runs the Python decision path on PostgreSQL too.
ENABLED = True

_N_HOLD = len(Hold._meta.concrete_fields)
_PLACE_SQL = (
    "SELECT * FROM ledger_place_hold(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
_CAPTURE_SQL = "SELECT * FROM ledger_capture(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
# The hold's columns in model field order (the table's own order may differ).
_RELEASE_SQL = (
    "SELECT f.o_status, f.o_amount, "  # noqa: S608 -- column names of the model only
    + ", ".join(f'(f.o_hold)."{f.column}"' for f in Hold._meta.concrete_fields)
    + " FROM ledger_release_hold(%s, %s, %s, %s, %s, %s, %s, %s, %s) AS f"
)


def enabled() -> bool:
    return ENABLED and connections[DEFAULT_DB_ALIAS].vendor == "postgresql"


def scope(*, savepoint: bool = True) -> AbstractContextManager[Any]:
    """The transaction a hot-path call runs in.

    Nested in a caller's transaction: `atomic()` as always (a savepoint unless told otherwise).
    Outermost: none of its own -- the function call is one statement, so in autocommit it is
    its own transaction. That saves the BEGIN and COMMIT round trips, and the row locks are held
    only while PostgreSQL runs the statement and commits it, never while this thread waits for
    the GIL. Everything the statement decides is all-or-nothing (a refusal after a write is
    raised inside it), and `on_commit` callbacks then run right after it, as after a COMMIT.
    """
    db = connections[DEFAULT_DB_ALIAS]
    if not db.in_atomic_block and db.get_autocommit():
        return nullcontext()
    return transaction.atomic(savepoint=savepoint)


def _call(sql: str, params: Sequence[Any]) -> tuple[Any, ...]:
    """Run `sql` as a server-side prepared statement on Django's connection; its one row.

    `config.prepared.execute`: in the caller's transaction (if any), database errors wrapped as
    Django's (so `retry_on_conflict` sees 40001/40P01), execute wrappers and query logging as
    with Django's cursors.
    """
    row = prepared.execute(sql, params)
    assert row is not None  # a function call always returns its one row
    return tuple(row)


# Model instances from values in field order (`Model.from_db`'s positional fast path).
_HOLD_FIELDS = [f.attname for f in Hold._meta.concrete_fields]
_TXN_FIELDS = [f.attname for f in LedgerTransaction._meta.concrete_fields]
assert _HOLD_FIELDS == ["id", "org_id", "project_id", "user_id", "key", "reference", "gpu_types",
                        "state", "authorized", "captured", "released", "created_at", "settled_at"]
assert _TXN_FIELDS == ["id", "org_id", "kind", "key", "hold_id", "created_at", "memo", "amount",
                       "params", "request_id"]


def place_hold(
    *, org_id: int, project_id: int | None, user_id: int | None, key: str, reference: str,
    types: list[str], amount: int, params: dict[str, Any], actor: Any, audit_as: CallerEvent | None,
) -> Hold | None:
    """Insert the hold, fund it and audit it; None when (org, key) exists (the caller replays)."""
    actor_type, actor_id = actor_fields(actor)
    if audit_as is None:  # the ledger's own event: subject = the hold (filled in by SQL)
        action, subject_type, subject_id = "ledger.hold", "ledger.hold", None
        reason_code, data = TransactionKind.HOLD.value, {"reason": ""}
    else:
        action, subject_type, subject_id = audit_as.action, audit_as.subject_type, str(audit_as.subject_id)
        reason_code = audit_as.reason_code or TransactionKind.HOLD.value
        data = {**audit_as.data, "ledger": "ledger.hold"}
    try:
        hold_id, created_at, _, _ = _call(_PLACE_SQL, [
            org_id, project_id, user_id, key, reference, json.dumps(types), amount, clock_offset(),
            json.dumps(params), current_request_id(), actor_type, actor_id, action, subject_type,
            subject_id, reason_code, json.dumps(data),
        ])
    except DatabaseError as error:
        if sqlstate_of(error) != INSUFFICIENT_CREDITS:
            raise
        raise InsufficientCredits(needed=amount, available=int(error.__cause__.diag.message_detail)) from None
    if hold_id is None:
        return None
    metrics.ledger_movement(kind=TransactionKind.HOLD, amount=amount, settled=False)
    return Hold.from_db(DEFAULT_DB_ALIAS, None, (
        hold_id, org_id, project_id, user_id, key, reference, types, HoldState.ACTIVE, amount, 0, 0,
        created_at, None,
    ))


def capture(*, hold_id: int, amount: int, txn_key: str, actor: Any, reason: str) -> LedgerTransaction:
    params = {"amount": amount}
    actor_type, actor_id = actor_fields(actor)
    request_id = current_request_id()
    status, org_id, state, remaining, txn_id, created_at = _call(_CAPTURE_SQL, [
        hold_id, amount, txn_key, clock_offset(), json.dumps(params), reason, request_id,
        actor_type, actor_id,
    ])
    if status == "ok":
        metrics.ledger_movement(kind=TransactionKind.CAPTURE, amount=amount, settled=False)
        return _txn(txn_id, org_id, TransactionKind.CAPTURE, txn_key, hold_id, created_at, reason,
                    amount, params, request_id)
    if status == "replay":
        previous = replay(org_id=org_id, key=txn_key, kind=TransactionKind.CAPTURE, params=params)
        assert previous is not None  # seen under the hold lock; the journal is append-only
        return previous
    _refuse(status, hold_id, state, amount, remaining)
    raise AssertionError("unreachable")


def release_hold(*, hold_id: int, txn_key: str, check_replay: bool, actor: Any, reason: str) -> Hold:
    params = {"final": True}
    actor_type, actor_id = actor_fields(actor)
    row = _call(_RELEASE_SQL, [
        hold_id, txn_key, check_replay, clock_offset(), json.dumps(params), reason,
        current_request_id(), actor_type, actor_id,
    ])
    status, amount = row[0], row[1]
    if status == "missing":
        _refuse(status, hold_id, "", 0, 0)
    hold = hold_from_row(row[2:2 + _N_HOLD])
    if status == "ok":
        metrics.ledger_movement(kind=TransactionKind.RELEASE, amount=amount, settled=True)
    elif status == "replay":
        replay(org_id=hold.org_id, key=txn_key, kind=TransactionKind.RELEASE, params=params)
    else:
        _refuse(status, hold_id, hold.state, 0, hold.remaining)
    return hold


def _txn(
    pk: int, org_id: int, kind: str, key: str, hold_id: int, created_at: datetime, memo: str,
    amount: int, params: dict[str, Any], request_id: str,
) -> LedgerTransaction:
    return LedgerTransaction.from_db(DEFAULT_DB_ALIAS, None, (
        pk, org_id, kind, key, hold_id, created_at, memo, amount, params, request_id,
    ))


def _refuse(status: str, hold_id: int, state: str, amount: int, remaining: int) -> None:
    if status == "missing":
        raise Hold.DoesNotExist(f"Hold {hold_id} does not exist.")
    if status == "inactive":
        raise HoldNotActive(f"Hold {hold_id} is {state}.", hold=hold_id)
    if status == "exceeds":
        raise CaptureExceedsHold(requested=amount, remaining=remaining)
    raise RuntimeError(f"unknown ledger function status {status!r}")

