"""The one place that fixes the ledger's lock order (DESIGN.md §6).

Order, always: idempotency record -> job -> hold -> budget rows -> buckets by id. Every ledger
service takes its row locks through these helpers, so two transactions never wait on each other
in opposite orders.
"""

from collections.abc import Iterable

from django.db.models import QuerySet

from ledger.models import Bucket, Hold


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
