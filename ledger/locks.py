"""The one place that fixes the ledger's lock order (DESIGN.md §6).

Order, always: idempotency record -> job -> hold -> budget rows -> buckets by id. Every ledger
service takes its row locks through these helpers, so two transactions never wait on each other
in opposite orders.
"""

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, TypeVar

from django.db import connection
from django.db.models import F, JSONField, Model, Q, QuerySet

from config.clock import db_now
from ledger.models import Bucket, Hold, HoldLine, LedgerTransaction

# Hot-path locks are plain SQL on PostgreSQL: compiling the ORM queries cost more CPU than
# running them. Rows are turned into model instances with `Model.from_db` (JSON columns come back
# as text from Django's psycopg setup and are decoded here).
M = TypeVar("M", bound=Model)


def _columns(model: type[Model], alias: str) -> str:
    return ", ".join(f'{alias}."{f.column}"' for f in model._meta.concrete_fields)


def _instance(model: type[M], values: Sequence[Any]) -> M:
    fields = model._meta.concrete_fields
    decoded = [
        json.loads(v) if isinstance(f, JSONField) and isinstance(v, str) else v
        for f, v in zip(fields, values, strict=True)
    ]
    return model.from_db(connection.alias, [f.attname for f in fields], decoded)


_HOLD_COLS = _columns(Hold, "h")
_N_HOLD = len(Hold._meta.concrete_fields)
_LINE_COLS = _columns(HoldLine, "l")
_N_LINE = len(HoldLine._meta.concrete_fields)
_BUCKET_COLS = _columns(Bucket, "b")
_LOCK_HOLD_SQL = f"SELECT {_HOLD_COLS}, now() FROM {Hold._meta.db_table} h WHERE h.id = %s FOR UPDATE"  # noqa: S608
_LOCK_LINES_SQL = (
    f"SELECT {_LINE_COLS}, {_BUCKET_COLS}, "  # noqa: S608
    f"(SELECT t.id FROM {LedgerTransaction._meta.db_table} t WHERE t.org_id = %s AND t.key = %s) "
    f"FROM {HoldLine._meta.db_table} l JOIN {Bucket._meta.db_table} b ON b.id = l.bucket_id "
    "WHERE l.hold_id = ANY(%s) AND l.authorized > l.captured + l.released "
    "ORDER BY l.bucket_id, l.id FOR UPDATE OF b"
)


def hold_from_row(values: Sequence[Any]) -> Hold:
    """A Hold from its columns in model field order (e.g. a `ledger_hold` composite expanded)."""
    return _instance(Hold, values)


def lock_hold(hold_id: int) -> Hold:
    """Lock one hold row and return its current (re-read) state."""
    return Hold.objects.select_for_update(of=("self",)).get(pk=hold_id)


def lock_buckets(ids: Iterable[int]) -> list[Bucket]:
    """Lock buckets in ascending id order and return them re-read, in that order."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    return list(Bucket.objects.filter(pk__in=wanted).order_by("pk").select_for_update(of=("self",)))


def lock_eligible_buckets_sql(where: str, params: Sequence[Any]) -> list[Bucket]:
    """PostgreSQL: lock the buckets matching a WHERE clause (over alias `b`), in id order."""
    sql = f"SELECT {_BUCKET_COLS} FROM {Bucket._meta.db_table} b WHERE {where} ORDER BY b.id FOR UPDATE"  # noqa: S608
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return [_instance(Bucket, row) for row in cursor.fetchall()]


def lock_bucket_queryset(queryset: QuerySet[Bucket]) -> list[Bucket]:
    """Lock every bucket a filter selects, in id order (rows re-checked against the filter)."""
    return list(queryset.order_by("pk").select_for_update(of=("self",)))


def claim_buckets(queryset: QuerySet[Bucket], limit: int) -> list[Bucket]:
    """Lock up to `limit` buckets in id order, skipping rows another worker holds."""
    return list(queryset.order_by("pk").select_for_update(of=("self",), skip_locked=True)[:limit])


def lock_buckets_ahead(*, extending_orgs: Iterable[int], releasing: Iterable[int]) -> None:
    """Lock at once, by id, every bucket that extending holds of some orgs and releasing some
    (locked) holds can touch: the orgs' unexpired buckets (an extension draws on some of them; not
    only those with credits available now, since a release elsewhere may refill one before the
    extension: review) and the released holds' open lines' buckets. For a caller that then extends
    and releases hold by hold across orgs, so that none of those locks comes after a higher id's
    (a bucket issued meanwhile has the highest id: locked last, still in order)."""
    orgs, holds = sorted(set(extending_orgs)), sorted(set(releasing))
    if not orgs and not holds:
        return
    lines = HoldLine.objects.filter(hold_id__in=holds, authorized__gt=F("captured") + F("released"))
    unexpired = Q(expires_at__isnull=True) | Q(expires_at__gt=db_now())
    match = (Q(org_id__in=orgs) & unexpired) | Q(pk__in=lines.values("bucket_id"))
    list(Bucket.objects.filter(match).order_by("pk").select_for_update(of=("self",)).values_list("pk"))


def lock_hold_with_clock(hold_id: int) -> tuple[Hold, datetime]:
    """`lock_hold` that also reads the transaction's DB clock (`now()`) in the same statement."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_LOCK_HOLD_SQL, [hold_id])
            row = cursor.fetchone()
        if row is None:
            raise Hold.DoesNotExist(f"Hold {hold_id} does not exist.")
        return _instance(Hold, row[:_N_HOLD]), row[_N_HOLD]
    return Hold.objects.select_for_update(of=("self",)).get(pk=hold_id), db_now()


def lock_holds(ids: Iterable[int]) -> list[Hold]:
    """Lock holds in ascending id order and return them re-read, in that order."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    return list(Hold.objects.filter(pk__in=wanted).order_by("pk").select_for_update(of=("self",)))


def lock_open_lines(hold_id: int) -> list[HoldLine]:
    """The hold's lines that still hold something, their buckets locked (ascending bucket id) and
    re-read in the same query (`line.bucket`). Call with the hold locked."""
    return lock_open_lines_of([hold_id])


def lock_open_lines_seeing_key(hold: Hold, key: str) -> tuple[list[HoldLine], bool]:
    """`lock_open_lines(hold)`, and in the same statement whether a journal transaction with
    `key` exists in the hold's org: (lines, maybe a replay). The statement starts after the hold
    lock is held, so it sees any transaction a writer of this hold's keys committed before us.
    "Maybe" is True when the key was seen or when there are no open lines (not known: look)."""
    if connection.vendor != "postgresql":
        lines = lock_open_lines(hold.pk)
        return lines, LedgerTransaction.objects.filter(org_id=hold.org_id, key=key).exists()
    rows = _lock_lines_sql(hold.org_id, key, [hold.pk])
    return _lines(rows), (not rows or rows[0][-1] is not None)


def _lock_lines_sql(org_id: int | None, key: str | None, hold_ids: list[int]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(_LOCK_LINES_SQL, [org_id, key, hold_ids])
        return cursor.fetchall()


def _lines(rows: list[tuple[Any, ...]]) -> list[HoldLine]:
    lines = []
    for row in rows:
        line = _instance(HoldLine, row[:_N_LINE])
        line.bucket = _instance(Bucket, row[_N_LINE:-1])
        lines.append(line)
    return lines


def lock_open_lines_of(hold_ids: Iterable[int]) -> list[HoldLine]:
    """`lock_open_lines` for several (locked) holds: every affected bucket locked once, by id."""
    wanted = sorted(set(hold_ids))
    if not wanted:
        return []
    if connection.vendor == "postgresql":
        return _lines(_lock_lines_sql(None, None, wanted))
    return list(
        HoldLine.objects.filter(hold_id__in=wanted, authorized__gt=F("captured") + F("released"))
        .select_related("bucket")
        .order_by("bucket_id", "pk")
        .select_for_update(of=("bucket",))
    )
