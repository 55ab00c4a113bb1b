"""Typed budget errors, rendered as RFC 9457 problem details."""

from config.errors import DomainError
from ledger.money import format_credits


class BudgetExceeded(DomainError):
    """A hard budget at `level` (org | project | member) cannot fit the requested amount."""

    type = "budget-exceeded"
    status = 402
    title = "Budget exceeded"

    def __init__(self, *, level: str, limit: int, used: int, requested: int, budget_id: int) -> None:
        super().__init__(
            f"The {level} budget allows {format_credits(limit)} credits this period; "
            f"{format_credits(used)} are used or held and {format_credits(requested)} more were requested.",
            level=level, limit=limit, used=used, requested=requested, budget_id=budget_id,
        )
        self.level = level
        self.limit = limit
        self.used = used
        self.requested = requested


class InvalidBudget(DomainError):
    """A budget definition that does not make sense (negative limit, empty window...)."""

    type = "validation-error"
    status = 400
    title = "Invalid budget"


class BudgetBeingSet(DomainError):
    """A budget of the org is being set right now: a hold that must not wait for it is tried later."""

    type = "budget-being-set"
    status = 409
    title = "Budget being set"

    def __init__(self) -> None:
        super().__init__("A budget of this organization is being set; the hold is tried again shortly.")


class WindowOpening(BudgetBeingSet):
    """A hard window budget has begun but is not counted yet (`open_started_windows`, beat): a
    new hold is refused for those seconds rather than checked against a partial count."""

    type = "budget-window-opening"

    def __init__(self, *, level: str, budget_id: int) -> None:
        DomainError.__init__(
            self, f"The {level} budget's window has just begun and is being counted; retry in a few "
            "seconds.", level=level, budget_id=budget_id, retry_after=5,
        )
        self.retry_after = 5  # the Retry-After header (config/api/exceptions.py)
