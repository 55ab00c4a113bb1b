"""The one place that fixes the ledger's lock order (DESIGN.md §6).

Order, always: idempotency record -> job -> hold -> budget rows -> buckets by id. Every ledger
service takes its row locks through these helpers, so two transactions never wait on each other
in opposite orders.
"""

from collections.abc import Iterable
from datetime import datetime

from django.db import connection
from django.db.models import DateTimeField, F, QuerySet
from django.db.models.expressions import RawSQL

from config.clock import db_now
from ledger.models import Bucket, Hold, HoldLine


def lock_hold(hold_id: int) -> Hold:
    """Lock one hold row and return its current (re-read) state."""
    return Hold.objects.select_for_update(of=("self",)).get(pk=hold_id)


def lock_buckets(ids: Iterable[int]) -> list[Bucket]:
    """Lock buckets in ascending id order and return them re-read, in that order."""
    wanted = sorted(set(ids))
    if not wanted:
        return []
    return list(Bucket.objects.filter(pk__in=wanted).order_by("pk").select_for_update(of=("self",)))


def lock_bucket_queryset(queryset: QuerySet[Bucket]) -> list[Bucket]:
    """Lock every bucket a filter selects, in id order (rows re-checked against the filter)."""
    return list(queryset.order_by("pk").select_for_update(of=("self",)))


def claim_buckets(queryset: QuerySet[Bucket], limit: int) -> list[Bucket]:
    """Lock up to `limit` buckets in id order, skipping rows another worker holds."""
    return list(queryset.order_by("pk").select_for_update(of=("self",), skip_locked=True)[:limit])


def lock_hold_with_clock(hold_id: int) -> tuple[Hold, datetime]:
    """`lock_hold` that also reads the transaction's DB clock (`now()`) in the same statement."""
    qs = Hold.objects.select_for_update(of=("self",))
    if connection.vendor != "postgresql":
        return qs.get(pk=hold_id), db_now()
    hold = qs.annotate(db_clock=RawSQL("now()", [], output_field=DateTimeField())).get(pk=hold_id)
    return hold, hold.db_clock  # type: ignore[attr-defined]


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


def lock_open_lines_of(hold_ids: Iterable[int]) -> list[HoldLine]:
    """`lock_open_lines` for several (locked) holds: every affected bucket locked once, by id."""
    wanted = sorted(set(hold_ids))
    if not wanted:
        return []
    return list(
        HoldLine.objects.filter(hold_id__in=wanted, authorized__gt=F("captured") + F("released"))
        .select_related("bucket")
        .order_by("bucket_id", "pk")
        .select_for_update(of=("bucket",))
    )
