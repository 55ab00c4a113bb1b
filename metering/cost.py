"""Usage to money (DESIGN.md §2). The one implementation is `scheduling.pricing.cost`:
`cost(gpu_ms, rate) = ceil(gpu_ms * rate / 3_600_000)`; this module only re-exports it for metering
callers. Charges are always `cost(total_now) - cost(total_before)`, so rounding never accumulates.
"""

from scheduling.pricing import MS_PER_HOUR, cost

__all__ = ["MS_PER_HOUR", "cost"]
