"""retry_on_conflict re-runs only 40001/40P01, a bounded number of times, and only when outermost."""

from __future__ import annotations

import pytest
from django.db import OperationalError, transaction

from ledger.retry import retry_on_conflict


class _Cause(Exception):
    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def _db_error(sqlstate: str) -> OperationalError:
    error = OperationalError("conflict")
    error.__cause__ = _Cause(sqlstate)
    return error


def _flaky(failures: list[str]):
    calls = []

    @retry_on_conflict(attempts=3, base_delay=0)
    def fn() -> str:
        calls.append(1)
        if failures:
            raise _db_error(failures.pop(0))
        return "done"

    return fn, calls


@pytest.mark.django_db(transaction=True)
def test_retries_deadlock_and_serialization_then_succeeds() -> None:
    fn, calls = _flaky(["40P01", "40001"])
    assert fn() == "done"
    assert len(calls) == 3


@pytest.mark.django_db(transaction=True)
def test_gives_up_after_bounded_attempts_and_on_other_errors() -> None:
    fn, calls = _flaky(["40001", "40001", "40001", "40001"])
    with pytest.raises(OperationalError):
        fn()
    assert len(calls) == 3
    fn, calls = _flaky(["23505"])
    with pytest.raises(OperationalError):
        fn()
    assert len(calls) == 1


@pytest.mark.django_db(transaction=True)
def test_no_retry_inside_a_callers_transaction() -> None:
    fn, calls = _flaky(["40001"])
    with pytest.raises(OperationalError), transaction.atomic():
        fn()
    assert len(calls) == 1
