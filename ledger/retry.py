"""Bounded retry of a whole transaction on serialization failures and deadlocks (40001, 40P01)."""

import functools
import random
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.db import DatabaseError, connection

P = ParamSpec("P")
R = TypeVar("R")

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})


def sqlstate_of(error: BaseException) -> str | None:
    """The SQLSTATE behind a Django database error (psycopg 3 keeps it on the cause)."""
    for candidate in (error, error.__cause__):
        state = getattr(candidate, "sqlstate", None)
        if state:
            return str(state)
    return None


def retry_on_conflict(
    attempts: int = 4, base_delay: float = 0.005
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Re-run the decorated transactional function when PostgreSQL aborts it as a conflict.

    Only the outermost call retries: inside a caller's `atomic()` the whole transaction is
    already doomed, so the error propagates for the caller's own retry.
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            if connection.in_atomic_block:
                return fn(*args, **kwargs)
            for attempt in range(1, attempts + 1):
                try:
                    return fn(*args, **kwargs)
                except DatabaseError as error:
                    if attempt == attempts or sqlstate_of(error) not in RETRYABLE_SQLSTATES:
                        raise
                    time.sleep(base_delay * (2**attempt) * (0.5 + random.random()))
            raise AssertionError("unreachable")

        return wrapper

    return decorate
