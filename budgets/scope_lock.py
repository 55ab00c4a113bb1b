"""The org's budget-definition lock: a budget set while a submission is in flight sees its hold.

A budget set mid-period starts from the active holds of its scope (`services._seed_current_period`).
A hold placed by a transaction still in flight is invisible to that count, and that transaction
read the budgets before the new one existed, so without this lock the hold was counted by no
period of the new budget and the budget could be overshot by it (a known gap until now, in
docs/api.md).

PostgreSQL transaction-scoped advisory locks, keyed by org (two int4 keys, a space apart from the
scheduler's single bigint key):

- every transaction that creates a hold counted in budgets takes the org's key SHARED before it
  reads the budgets — submissions wait (`share`), while a requeue, which may already hold locks
  on other holds of the org, only tries (`try_share`) and waits `budget` for a retry;
- a refund, which credits the budget periods that counted the job's spending and lays the refund
  on its captures (`budgets.refunds`), takes the key SHARED (`share`) before it reads them, so a
  recount in flight commits first and a later one subtracts the refunded captures;
- setting a budget takes the key EXCLUSIVE first (`own`), so it waits until every such
  transaction in flight has committed, and every later one reads the budgets after it commits.

Shared holders never wait for each other (no row, no MultiXact), so submissions of one org do
not serialize on it. SQLite (embedded mode) serializes write transactions: nothing to take.
The key is also taken inside `jobs_submit` (migration scheduling 0020), with the same formula.
"""

from __future__ import annotations

from django.db import connection

# int4 class key for the org's budget scope (ASCII "BUDG"); the second key is the org id.
BUDGET_SCOPE_CLASS = 0x4255_4447
_INT4 = 2**31


def _key(org_id: int) -> list[int]:
    return [BUDGET_SCOPE_CLASS, org_id % _INT4]  # an id past int4 only shares a key: more waiting


def _take(function: str, org_id: int) -> bool:
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {function}(%s, %s)::text", _key(org_id))
        (result,) = cursor.fetchone()
    return result != "false"  # the blocking forms return void ('')


def share(org_id: int) -> None:
    """Wait for any budget of the org being set, then keep budgets from being set until commit."""
    _take("pg_advisory_xact_lock_shared", org_id)


def try_share(org_id: int) -> bool:
    """`share` without waiting: False while a budget of the org is being set (or waits to be)."""
    return _take("pg_try_advisory_xact_lock_shared", org_id)


def own(org_id: int) -> None:
    """Wait until no transaction that may place a hold of the org is in flight; hold them off."""
    _take("pg_advisory_xact_lock", org_id)
