"""GPU-hour prices and the cost arithmetic (integers only: micro-credits, GPU-milliseconds).

`cost(gpu_ms, rate) = ceil(gpu_ms * rate / 3_600_000)` — a rate is micro-credits per GPU-hour.
"""

from collections.abc import Iterable, Sequence
from datetime import datetime

from config.clock import db_now
from config.errors import DomainError
from scheduling.models import GpuPrice

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


def current_prices(gpu_type_names: Iterable[str], at: datetime | None = None) -> dict[str, int]:
    """The price per GPU-hour in effect at `at` (DB clock by default) of each named type that has one."""
    names = sorted(set(gpu_type_names))
    if not names:
        return {}
    at = at or db_now()
    # Oldest first, so the newest price in effect wins; portable (no DISTINCT ON) for embedded
    # SQLite, and price histories are short.
    rows = (
        GpuPrice.objects.filter(gpu_type__name__in=names, effective_from__lte=at)
        .order_by("effective_from", "id")
        .values_list("gpu_type__name", "price_per_gpu_hour")
    )
    return dict(rows)


def current_price(gpu_type_name: str, at: datetime | None = None) -> int:
    prices = current_prices([gpu_type_name], at)
    if gpu_type_name not in prices:
        raise NoPrice([gpu_type_name])
    return prices[gpu_type_name]


def hold_amount(*, gpu_types: Sequence[str], gpu_count: int, seconds: int, at: datetime | None = None) -> int:
    """Cost of `seconds` on `gpu_count` GPUs of the most expensive of `gpu_types` (current prices)."""
    prices = current_prices(gpu_types, at)
    missing = [name for name in gpu_types if name not in prices]
    if missing or not gpu_types:
        raise NoPrice(missing or ["(none)"])
    return cost(seconds * 1000 * gpu_count, max(prices.values()))
