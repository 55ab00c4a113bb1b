"""Usage to money: the one cost formula (DESIGN.md §2), pure and integer-only."""

from __future__ import annotations

MS_PER_HOUR = 3_600_000


def cost(gpu_ms: int, rate: int) -> int:
    """Micro-credits for `gpu_ms` GPU-milliseconds at `rate` micro-credits per GPU-hour, rounded up.

    Charges are always `cost(total_now) - cost(total_before)`, so rounding never accumulates.
    """
    if gpu_ms < 0 or rate < 0:
        raise ValueError("gpu_ms and rate must be >= 0")
    return -((-gpu_ms * rate) // MS_PER_HOUR)


def gpu_ms_for(amount: int, rate: int) -> int:
    """The most GPU-milliseconds that `amount` micro-credits pay for at `rate` (inverse of cost)."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    return max(0, amount) * MS_PER_HOUR // rate
