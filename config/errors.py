"""The base of every typed business error; the API renders them as RFC 9457 problem details."""

from typing import Any


class DomainError(Exception):
    """A business rule said no. `type` is stable (a slug), `detail` is for humans."""

    type: str = "domain-error"
    status: int = 400
    title: str = "Request rejected"

    def __init__(self, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.extra = extra
