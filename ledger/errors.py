"""Typed ledger errors; the API renders them as RFC 9457 problem details by `type` and `status`."""

from config.errors import DomainError
from ledger.money import format_credits


class LedgerError(DomainError):
    """Base of every ledger rule violation."""

    type = "ledger-error"
    status = 400
    title = "Ledger operation rejected"


class InvalidAmount(LedgerError):
    """An amount that is zero, negative, not an integer of micro-credits, or above the cap."""

    type = "invalid-amount"
    title = "Invalid amount"


class InvalidExpiry(LedgerError):
    """An expiry at or before the effective time, or already in the past (credits born expired)."""

    type = "invalid-expiry"
    title = "Invalid expiry"


class UnknownGpuType(LedgerError):
    """A GPU type name that the fleet does not know."""

    type = "unknown-gpu-type"
    title = "Unknown GPU type"

    def __init__(self, names: list[str]) -> None:
        super().__init__(f"Unknown GPU type(s): {', '.join(names)}.", names=names)
        self.names = names


class InvalidParameter(LedgerError):
    """A parameter outside its allowed values (kind, source, a project of another org...)."""

    type = "invalid-parameter"
    title = "Invalid parameter"


class InsufficientCredits(LedgerError):
    """The eligible buckets cannot fund the requested amount (all-or-nothing)."""

    type = "insufficient-credits"
    status = 402
    title = "Insufficient credits"

    def __init__(self, needed: int, available: int, detail: str = "", **extra: object) -> None:
        super().__init__(
            detail or f"Needs {format_credits(needed)} credits, only {format_credits(available)} available.",
            needed=needed,
            available=available,
            **extra,
        )
        self.needed = needed
        self.available = available


class HoldNotActive(LedgerError):
    """The hold is already settled or voided."""

    type = "hold-not-active"
    status = 409
    title = "Hold is not active"


class CaptureExceedsHold(LedgerError):
    """A capture or release larger than what the hold still holds."""

    type = "capture-exceeds-hold"
    status = 409
    title = "Amount exceeds the hold"

    def __init__(self, requested: int, remaining: int) -> None:
        super().__init__(
            f"Requested {format_credits(requested)} credits, the hold has {format_credits(remaining)} left.",
            requested=requested,
            remaining=remaining,
        )
        self.requested = requested
        self.remaining = remaining


class IdempotencyConflict(LedgerError):
    """The same idempotency key (or finance reference) was used with different parameters."""

    type = "idempotency-conflict"
    status = 422
    title = "Idempotency key reused with different parameters"


class RefundExceedsCharges(LedgerError):
    """A refund larger than what the job (or attempt) was charged, less what was refunded for it."""

    type = "refund-exceeds-charges"
    status = 409
    title = "Refund exceeds what was charged"

    def __init__(self, requested: int, refundable: int, *, charged: int, refunded: int, what: str) -> None:
        super().__init__(
            f"Requested {format_credits(requested)} credits; {what} was charged {format_credits(charged)}, "
            f"{format_credits(refunded)} refunded already, so at most {format_credits(refundable)} can be.",
            requested=requested, refundable=refundable, charged=charged, refunded=refunded,
        )
        self.requested = requested
        self.refundable = refundable
