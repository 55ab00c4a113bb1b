"""Typed errors of the HTTP API layer (idempotency, rate limits, request shape)."""

from config.errors import DomainError


class IdempotencyKeyMissing(DomainError):
    """A mutating route was called without an `Idempotency-Key` header."""

    type = "idempotency-key-missing"
    status = 400
    title = "Idempotency-Key header required"


class IdempotencyKeyInvalid(DomainError):
    """The `Idempotency-Key` header is empty, too long or not printable ASCII."""

    type = "idempotency-key-missing"
    status = 400
    title = "Idempotency-Key header invalid"


class IdempotencyKeyReused(DomainError):
    """The key was already used by this caller for a different request."""

    type = "idempotency-key-reused"
    status = 422
    title = "Idempotency key reused with a different request"


class IdempotencyKeyInFlight(DomainError):
    """Another request with the same key is still being processed."""

    type = "idempotency-key-in-flight"
    status = 409
    title = "A request with this idempotency key is in flight"


class RateLimited(DomainError):
    """Too many requests (per key, per org, or concurrent submissions of an org)."""

    type = "rate-limited"
    status = 429
    title = "Rate limit exceeded"

    def __init__(self, detail: str, *, retry_after: int, scope: str, limit: str) -> None:
        super().__init__(detail, scope=scope, limit=limit, retry_after=retry_after)
        self.retry_after = retry_after


class RateLimiterUnavailable(DomainError):
    """The rate limiter's store (Redis) cannot be reached: refused before anything is written."""

    type = "rate-limiter-unavailable"
    status = 503
    title = "Rate limiter unavailable"

    def __init__(self, detail: str, *, retry_after: int = 1) -> None:
        super().__init__(detail, retry_after=retry_after)
        self.retry_after = retry_after


class PayloadTooLarge(DomainError):
    """The request body exceeds `API_MAX_BODY_BYTES` (rejected before parsing)."""

    type = "validation-error"
    status = 400
    title = "Request body too large"


class PageOutOfRange(DomainError):
    """A list was asked for a page past its last one (DRF said only "Invalid page.")."""

    type = "not-found"
    status = 404
    title = "Not found"

    def __init__(self, page: int, last_page: int) -> None:
        super().__init__(f"Page {page} is past the last page ({last_page}).", page=page, last_page=last_page)
