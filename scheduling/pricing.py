"""GPU-hour prices and the cost arithmetic (integers only: micro-credits, GPU-milliseconds).

`cost(gpu_ms, rate) = ceil(gpu_ms * rate / 3_600_000)` — a rate is micro-credits per GPU-hour.

The submission path reads the fleet catalog (GPU types, their price histories, priority classes,
regions, the nodes' shapes and the quotas) from a per-process snapshot (`catalog()`), refreshed
every `CATALOG_CACHE_SECONDS` and dropped at once when this process saves or deletes one of those
rows. Other processes see a change within the TTL. The snapshot holds whole price histories, so
"the price in effect at `at`" is still decided against the transaction's clock: a price scheduled
for later takes effect exactly on time.
"""

import bisect
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models.signals import post_delete, post_save

from accounts.models import Region
from config.clock import db_now
from config.errors import DomainError
from scheduling import core
from scheduling.core.feasibility import idle_fleet
from scheduling.core.placement import FleetState
from scheduling.models import GpuPrice, GpuType, Node, PriorityClass, PriorityGrant, Quota

MS_PER_HOUR = 3_600_000


class NoPrice(DomainError):
    """A GPU type that has no price in effect (unknown, or priced only in the future)."""

    type = "validation-error"
    status = 400
    title = "GPU type has no price"

    def __init__(self, names: Sequence[str]) -> None:
        super().__init__(
            f"No price in effect for GPU type(s): {', '.join(names)}.",
            errors={"gpu_types": [f"No price in effect for {name}." for name in names]},
        )


def cost(gpu_ms: int, rate: int) -> int:
    """Micro-credits for `gpu_ms` GPU-milliseconds at `rate` micro-credits per GPU-hour (ceil)."""
    if gpu_ms < 0 or rate < 0:
        raise ValueError("usage and rate are non-negative")
    return -(-gpu_ms * rate // MS_PER_HOUR)


def held_seconds(wall_seconds: int, window_seconds: int | None) -> int:
    """The run time a job's hold is for: its max wall, or the org's hold window when shorter. No
    window (null) holds the whole max wall time; a window is at least 60 s (a CHECK, which also
    refuses the 0 once read as "no window"), and is held for no less than the metering look-ahead
    (`window_floor_seconds`, 273 s by default): a shorter first hold was admitted, then stopped at
    its first charge when it could not be extended, and ran past what it held until the stop took
    effect, unpaid (review)."""
    from metering.conf import window_floor_seconds

    if not window_seconds:
        return wall_seconds
    return min(wall_seconds, max(window_seconds, window_floor_seconds()))


def held_gpu_ms(gpus: int, wall_seconds: int, window_seconds: int | None) -> int:
    """The GPU-time a job's hold is for (`held_seconds` on its GPUs)."""
    return gpus * held_seconds(wall_seconds, window_seconds) * 1000


def covered_rate(held: int, gpu_ms: int) -> int:
    """The highest rate (micro-credits per GPU-hour) at which `gpu_ms` costs at most `held`."""
    return held * MS_PER_HOUR // gpu_ms if gpu_ms > 0 else 0


# --- the catalog snapshot ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PriorityInfo:
    id: int
    name: str
    preemptible: bool
    granted_orgs: frozenset[int] | None = None  # a restricted class: the orgs that may use it

    def open_to(self, org_id: int) -> bool:
        return self.granted_orgs is None or org_id in self.granted_orgs


@dataclass(frozen=True, slots=True)
class Catalog:
    """What submissions validate and price against (plain data, no ORM)."""

    memory_gb: dict[str, int]  # GPU type name -> memory per GPU
    # GPU type name -> (effective_from ascending, prices in the same order)
    prices: dict[str, tuple[tuple[datetime, ...], tuple[int, ...]]]
    priority_classes: dict[str, PriorityInfo]
    regions: frozenset[str]
    # What could ever run: every registered node as if ready and idle, and the quotas (submissions
    # that never could are refused: `scheduling.services.reservation.check_can_ever_run`).
    fleet: FleetState
    quotas: core.Quotas

    def price_at(self, name: str, at: datetime) -> int | None:
        span = self.price_span(name, at)
        return span[0] if span is not None else None

    def price_span(self, name: str, at: datetime) -> tuple[int, datetime, datetime | None] | None:
        """(price in effect at `at`, since when, until the next scheduled price or None)."""
        history = self.prices.get(name)
        if history is None:
            return None
        starts, values = history
        index = bisect.bisect_right(starts, at) - 1
        if index < 0:
            return None
        return values[index], starts[index], starts[index + 1] if index + 1 < len(starts) else None


_lock = threading.Lock()
_snapshot: tuple[float, Catalog] | None = None


def _load() -> Catalog:
    histories: dict[str, tuple[list[datetime], list[int]]] = {}
    rows = GpuPrice.objects.order_by("effective_from", "id").values_list(
        "gpu_type__name", "effective_from", "price_per_gpu_hour"
    )
    for name, starts, price in rows:
        dates, values = histories.setdefault(name, ([], []))
        if dates and dates[-1] == starts:  # same instant: the later row wins (as in SQL order)
            values[-1] = price
            continue
        dates.append(starts)
        values.append(price)
    return Catalog(
        memory_gb=dict(GpuType.objects.values_list("name", "memory_gb")),
        prices={name: (tuple(d), tuple(v)) for name, (d, v) in histories.items()},
        priority_classes=_priority_classes(),
        regions=frozenset(Region.objects.values_list("code", flat=True)),
        fleet=idle_fleet(
            core.Node(id=pk, gpu_type=name, gpu_count=count, free_gpu_indices=frozenset(), region=region,
                      nvlink_domain=nvlink, ib_group=ib)
            for pk, name, count, region, nvlink, ib in Node.objects.values_list(
                "pk", "gpu_type__name", "gpu_count", "region__code", "nvlink_domain", "ib_group"
            )
        ),
        quotas=_load_quotas(),
    )


def _load_quotas() -> core.Quotas:
    from scheduling.adapter.snapshot import load_quotas  # the scheduler's own reading of them

    return load_quotas()


def catalog(*, fresh: bool = False) -> Catalog:
    """The per-process catalog snapshot (reloaded after `CATALOG_CACHE_SECONDS`, or when `fresh`)."""
    global _snapshot
    ttl = float(getattr(settings, "CATALOG_CACHE_SECONDS", 10.0))
    now = time.monotonic()
    snapshot = _snapshot
    if not fresh and ttl > 0 and snapshot is not None and now - snapshot[0] < ttl:
        return snapshot[1]
    loaded = _load()
    with _lock:
        _snapshot = (now, loaded)
    return loaded


def _priority_classes() -> dict[str, PriorityInfo]:
    grants: dict[int, set[int]] = {}
    for class_id, org_id in PriorityGrant.objects.values_list("priority_class_id", "org_id"):
        grants.setdefault(class_id, set()).add(org_id)
    return {
        name: PriorityInfo(pk, name, preemptible, frozenset(grants.get(pk, ())) if restricted else None)
        for pk, name, preemptible, restricted in PriorityClass.objects.values_list(
            "pk", "name", "preemptible", "restricted")
    }


def catalog_knowing(*, gpu_types: Iterable[str] = (), priority_class: str = "",
                    regions: Iterable[str] = ()) -> Catalog:
    """The snapshot, reloaded once if it does not know a name (a row created in another process
    within the TTL is then seen at once; only truly unknown names cost the extra reads)."""
    snap = catalog()
    if (
        any(name not in snap.memory_gb for name in gpu_types)
        or (priority_class and priority_class not in snap.priority_classes)
        or any(code not in snap.regions for code in regions)
    ):
        snap = catalog(fresh=True)
    return snap


def clear_catalog_cache(**_kwargs: Any) -> None:
    global _snapshot
    with _lock:
        _snapshot = None


for _model in (GpuType, GpuPrice, PriorityClass, PriorityGrant, Region, Node, Quota):
    post_save.connect(clear_catalog_cache, sender=_model, weak=False,
                      dispatch_uid=f"catalog-save-{_model.__name__}")
    post_delete.connect(clear_catalog_cache, sender=_model, weak=False,
                        dispatch_uid=f"catalog-delete-{_model.__name__}")


# --- prices --------------------------------------------------------------------------------------


def current_prices(gpu_type_names: Iterable[str], at: datetime | None = None) -> dict[str, int]:
    """The price per GPU-hour in effect at `at` (DB clock by default) of each named type that has one."""
    names = sorted(set(gpu_type_names))
    if not names:
        return {}
    at = at or db_now()
    snap = catalog_knowing(gpu_types=names)
    prices = {name: snap.price_at(name, at) for name in names}
    return {name: price for name, price in prices.items() if price is not None}


def current_price(gpu_type_name: str, at: datetime | None = None) -> int:
    prices = current_prices([gpu_type_name], at)
    if gpu_type_name not in prices:
        raise NoPrice([gpu_type_name])
    return prices[gpu_type_name]


def hold_amount(*, gpu_types: Sequence[str], gpu_count: int, seconds: int, at: datetime | None = None) -> int:
    """Cost of `seconds` on `gpu_count` GPUs of the most expensive of `gpu_types` (current prices)."""
    return hold_quote(gpu_types=gpu_types, gpu_count=gpu_count, seconds=seconds, at=at or db_now()).amount


@dataclass(frozen=True, slots=True)
class Quote:
    """A hold's amount, the price it used and the instants between which every price it used stays
    in effect."""

    amount: int
    rate: int  # the highest price per GPU-hour among the types: the one `amount` is priced at
    valid_from: datetime
    valid_until: datetime | None  # None: no later price of these types is scheduled


def hold_quote(*, gpu_types: Sequence[str], gpu_count: int, seconds: int, at: datetime) -> Quote:
    """`hold_amount` at `at`, with the span around `at` in which it would be the same: a caller
    that prices before it reads the transaction's clock checks that clock against the span."""
    snap = catalog_knowing(gpu_types=gpu_types)
    spans = {name: snap.price_span(name, at) for name in set(gpu_types)}
    missing = [name for name in gpu_types if spans[name] is None]
    if missing or not gpu_types:
        raise NoPrice(missing or ["(none)"])
    found = [span for span in spans.values() if span is not None]
    untils = [until for _, _, until in found if until is not None]
    rate = max(price for price, _, _ in found)
    return Quote(
        amount=cost(seconds * 1000 * gpu_count, rate),
        rate=rate,
        valid_from=max(since for _, since, _ in found),
        valid_until=min(untils) if untils else None,
    )
