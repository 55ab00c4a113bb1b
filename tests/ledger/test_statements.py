"""Monthly statements over random ledger histories spanning several months (Hypothesis): each month
adds up (closing = opening + issued - consumed - expired - voided), one month closes what the next
opens, the consumption lines sum to what was consumed, and the last closing is the buckets' balance."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.clock import ledger_now, shifted
from ledger.errors import DomainError
from ledger.models import Bucket, Hold, HoldState
from ledger.services import capture, expire_due_buckets, place_hold, release_hold, void_credits
from ledger.statements import org_statement
from tests.factories import OrganizationFactory, ProjectFactory, fund

OPS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=100),  # day of the history (0 = 101 days ago)
        st.sampled_from(["issue", "hold", "hold", "capture", "capture", "release", "void", "close",
                         "expire"]),
        st.integers(min_value=1, max_value=500),  # an amount, or which bucket / hold
        st.sampled_from([None, 3, 20, 45]),  # an issue's lifetime in days (None: never expires)
    ),
    min_size=5, max_size=30,
)


def _months(first: str, last: str) -> list[str]:
    year, month = map(int, first.split("-"))
    out = []
    while f"{year:04d}-{month:02d}" <= last:
        out.append(f"{year:04d}-{month:02d}")
        year, month = (year + 1, 1) if month == 12 else (year, month + 1)
    return out


def _apply(org: object, project: object, op: str, n: int, lifetime: int | None, step: int) -> None:
    buckets = list(Bucket.objects.filter(org=org).order_by("pk"))
    holds = list(Hold.objects.filter(org=org, state=HoldState.ACTIVE).order_by("pk"))
    if op == "issue":
        expires = ledger_now() + timedelta(days=lifetime) if lifetime else None
        fund(org, n * 1000, expires_at=expires, reference=f"r{step}")
    elif op == "hold":
        place_hold(org=org, amount=n * 100, key=f"h{step}", project=project if n % 2 else None)
    elif op == "capture" and holds:
        hold = holds[n % len(holds)]
        capture(hold=hold, amount=max(1, hold.remaining // 2), key=f"c{step}")
    elif op == "release" and holds:
        release_hold(hold=holds[n % len(holds)])
    elif op in ("void", "close") and buckets:
        bucket = buckets[n % len(buckets)]
        void_credits(bucket=bucket, reason="test", key=f"v{step}", close=op == "close",
                     amount=None if op == "close" else max(1, bucket.available // 3) or None)
    elif op == "expire":
        expire_due_buckets()


@pytest.mark.django_db
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_statements_add_up_and_chain_over_random_histories(ops: list) -> None:
    org = OrganizationFactory()
    project = ProjectFactory(org=org)
    start = ledger_now() - timedelta(days=101)
    history = [(0, "issue", 500, None), *sorted(ops, key=lambda o: o[0])]  # funds from the start
    for step, (day, op, n, lifetime) in enumerate(history):
        with shifted(timedelta(days=day - 101, seconds=step)):
            try:
                with transaction.atomic():
                    _apply(org, project, op, n, lifetime, step)
            except DomainError:
                pass  # refused (no funds, nothing to void...): writes nothing
    months = _months(start.strftime("%Y-%m"), ledger_now().strftime("%Y-%m"))
    statements = [org_statement(org=org, month=month) for month in months]
    assert statements[0].opening.total == 0
    for before, after in itertools.pairwise(statements):
        assert before.closing == after.opening
    for s in statements:
        assert s.closing.total == s.opening.total + s.issued - s.consumed - s.expired - s.voided
        assert sum(line.amount for line in s.consumption) == s.consumed
        assert sum(issue.amount for issue in s.issues) == s.issued
    buckets = Bucket.objects.filter(org=org)
    assert statements[-1].closing.available == sum(b.available for b in buckets)
    assert statements[-1].closing.held == sum(b.held for b in buckets)


@pytest.mark.django_db(transaction=True)
def test_a_capture_committing_while_a_statement_is_read_is_in_all_its_figures_or_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review: the figures came from separate queries; a capture committing between the closing
    balance and the month's sums made `consumed` count what `closing` did not."""
    import threading

    from django.db import connection

    from ledger import statements

    org = OrganizationFactory()
    with shifted(-timedelta(seconds=5)):  # dated before the statement's "now"
        fund(org, 10_000)
        hold = place_hold(org=org, amount=5_000, key="running")
    balance = statements._balance
    calls = []

    def balance_then_a_capture_commits(org_id: int, before: object) -> object:
        result = balance(org_id, before)
        calls.append(before)
        if len(calls) == 2:  # the closing balance is read: another connection captures now
            def other() -> None:
                try:
                    with shifted(-timedelta(seconds=2)):  # its transaction began before "now"
                        capture(hold=hold, amount=1_000, key="meanwhile")
                finally:
                    connection.close()
            thread = threading.Thread(target=other)
            thread.start()
            thread.join()
        return result

    monkeypatch.setattr(statements, "_balance", balance_then_a_capture_commits)
    s = org_statement(org=org, month=ledger_now().strftime("%Y-%m"))
    assert len(calls) == 2
    assert s.closing.total == s.opening.total + s.issued - s.consumed - s.expired - s.voided
    assert sum(line.amount for line in s.consumption) == s.consumed


class _OpenTransaction:
    """A transaction on another connection that stays open (after its first query) until closed."""

    def __init__(self, work: object) -> None:
        import threading

        self.begun, self.finish = threading.Event(), threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, args=(work,))
        self.thread.start()
        assert self.begun.wait(10)

    def _run(self, work: object) -> None:
        from django.db import connection

        try:
            with transaction.atomic():
                work()  # type: ignore[operator]
                self.begun.set()
                self.finish.wait(10)
        except BaseException as error:  # reported to the test
            self.errors.append(error)
            self.begun.set()
        finally:
            connection.close()

    def close(self) -> None:
        self.finish.set()
        self.thread.join(10)
        assert not self.errors, self.errors


@pytest.mark.django_db(transaction=True)
def test_a_month_is_final_once_no_transaction_begun_in_it_can_still_commit() -> None:
    """A transaction is dated by its start: one begun in a month's last second and committed after
    it ended still lands in the month. The statement says `final` only once none can."""
    import time

    from config.clock import db_now
    from ledger.statements import parse_month

    org = OrganizationFactory()
    fund(org, 10_000)
    hold = place_hold(org=org, amount=5_000, key="running")
    month = ledger_now().strftime("%Y-%m")
    month_end = parse_month(month)[1]
    with shifted(month_end - db_now() - timedelta(seconds=1)):  # one second before the month ends
        assert not org_statement(org=org, month=month).final  # in progress
        late = _OpenTransaction(lambda: capture(hold=hold, amount=1_000, key="late"))  # dated in it
        time.sleep(1.2)
        assert ledger_now() >= month_end
        ended = org_statement(org=org, month=month)
        assert not ended.final and ended.consumed == 0
        # A transaction begun after the end does not hold the month open (it is dated after it).
        after = _OpenTransaction(lambda: Bucket.objects.filter(org=org).count())
        late.close()
        final = org_statement(org=org, month=month)
        assert final.final and final.consumed == 1_000  # the late capture landed in the month
        after.close()
        next_month = org_statement(org=org, month=ledger_now().strftime("%Y-%m"))
        assert not next_month.final and next_month.consumed == 0


@pytest.mark.django_db(transaction=True)
def test_a_session_the_role_may_not_see_keeps_a_month_provisional() -> None:
    """Without pg_read_all_stats, PostgreSQL hides another role's sessions (backend_type, state and
    xact_start read NULL): such a session might hold a transaction dated in the month."""
    import os
    import time

    from django.db import connection

    from ledger.statements import _OPEN_BEFORE

    role = f"gpubank_reader_{os.getpid()}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role} NOLOGIN")
    try:
        def open_before(cutoff: str) -> bool:
            with connection.cursor() as cursor:
                cursor.execute(f"SET ROLE {role}")
                try:
                    cursor.execute(_OPEN_BEFORE, [cutoff])
                    return cursor.fetchone()[0]
                finally:
                    cursor.execute("RESET ROLE")

        long_ago = "1970-01-02T00:00:00Z"  # no transaction began before it

        def nothing_open() -> bool:
            # A closed session's backend leaves pg_stat_activity a moment after its client.
            deadline = time.monotonic() + 10
            while open_before(long_ago) and time.monotonic() < deadline:
                time.sleep(0.05)
            return open_before(long_ago) is False

        assert nothing_open()  # no other session
        other = _OpenTransaction(lambda: Bucket.objects.count())  # the superuser's: hidden from the role
        try:
            assert open_before(long_ago) is True
        finally:
            other.close()
        assert nothing_open()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP ROLE {role}")
