"""A budget's recount on a busy org: `set_budget` redefining a period, as a ratio to raw SQL.

Run: DJANGO_SETTINGS_MODULE=config.settings.test .venv/bin/python bench/budget_recount.py [--holds 20000]

A budget set or redefined mid-period (or a window opening) counts its scope's spending so far,
one charge per hold (`budgets/spent_counts.py`), while the org's budget-definition lock holds the
org's submissions. This measures that on an org with `--holds` holds captured this month
(`--active` of them still running: held and spent), a tenth of them partly refunded, alternating
the budget between the month and a window covering now (each change a full recount). The
baseline, same database and run: the bare aggregate of the same captures (`SELECT hold_id,
sum(amount) ... GROUP BY hold_id`), the least any recount reads.

Creates a scratch database (gpubank_bench_<pid>) on the configured PostgreSQL server, migrates it,
measures, checks that each period's charges add up to its figures, and drops it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import timedelta

from _scratch import scratch_database


def _timed(work: object, repeat: int) -> float:
    """Median seconds of `repeat` calls."""
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()  # type: ignore[operator]
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def _clone(connection: object, template: object, count: int, org_id: int) -> None:
    """`count` copies of the hold, each with a copy of its capture (in SQL: the services would
    take minutes)."""
    from ledger.models import LedgerTransaction, TransactionKind

    first = LedgerTransaction.objects.get(hold=template, kind=TransactionKind.CAPTURE)
    with connection.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute(
            """WITH new AS (
                 INSERT INTO ledger_hold (org_id, project_id, user_id, authorized, captured, released,
                                          state, created_at, settled_at, key, reference, gpu_types)
                 SELECT org_id, project_id, user_id, authorized, captured, released, state, created_at,
                        settled_at, key || '-' || g, reference, gpu_types
                 FROM ledger_hold, generate_series(1, %s) g WHERE id = %s RETURNING id)
               INSERT INTO ledger_ledgertransaction (org_id, kind, key, hold_id, created_at, memo, amount,
                                                     params, request_id)
               SELECT %s, 'capture', 'bench-' || new.id, new.id, %s, '', %s, '{}', '' FROM new""",
            [count, template.pk, org_id, first.created_at, first.amount])  # type: ignore[attr-defined]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--holds", type=int, default=20_000)
    parser.add_argument("--active", type=int, default=5_000, help="of which still running (held and spent)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    with scratch_database():
        from django.db import connection, transaction

        from budgets.models import Budget, BudgetCharge, BudgetPeriod
        from budgets.services import set_budget
        from config.clock import db_now
        from ledger.models import MICRO
        from ledger.services import capture, issue_credits, place_hold, release_hold
        from tests.factories import ProjectFactory, UserFactory

        project, user = ProjectFactory(), UserFactory()
        org = project.org
        issue_credits(org=org, amount=10**9 * MICRO, kind="paid", source="purchase", reference="bench",
                      reason="benchmark funding")
        finished = place_hold(org=org, amount=MICRO, key="finished", project=project, user=user)
        capture(hold=finished, amount=MICRO // 2, key="finished")
        release_hold(hold=finished, key="finished")
        running = place_hold(org=org, amount=MICRO, key="running", project=project, user=user)
        capture(hold=running, amount=MICRO // 2, key="running")
        print(f"making {args.holds:,} holds with a capture each, {args.active:,} still running ...",
              flush=True)
        for template, count in ((finished, args.holds - args.active), (running, args.active)):
            _clone(connection, template, count, org.pk)
        with connection.cursor() as cur:
            cur.execute(  # a tenth of the captures partly refunded
                """INSERT INTO budgets_refundedcapture (capture_id, hold_id, reference, amount, created_at)
                   SELECT id, hold_id, 'bench', amount / 3, now() FROM ledger_ledgertransaction
                   WHERE kind = 'capture' AND id % 10 = 0""")
            cur.execute("ANALYZE")

        def baseline() -> None:
            with connection.cursor() as cur:
                cur.execute(
                    "SELECT t.hold_id, sum(t.amount) FROM ledger_ledgertransaction t "
                    "JOIN ledger_hold h ON h.id = t.hold_id WHERE t.org_id = %s AND t.kind = 'capture' "
                    "AND h.org_id = %s GROUP BY t.hold_id", [org.pk, org.pk])
                cur.fetchall()

        now = db_now()
        window = {"period": "window", "window_start": now - timedelta(days=40),
                  "window_end": now + timedelta(days=1)}
        toggle = {"n": 0}

        def recount() -> None:
            toggle["n"] += 1
            shape = window if toggle["n"] % 2 else {"period": "month"}
            with transaction.atomic():
                set_budget(org=org, limit=10**15, enforcement="hard", **shape)

        raw = _timed(baseline, args.repeat)
        ours = _timed(recount, args.repeat)
        bad = [p.pk for p in BudgetPeriod.objects.filter(budget__in=Budget.objects.filter(org=org))
               if p.spent != sum(BudgetCharge.objects.filter(period=p).values_list("spent", flat=True))]
        print(f"holds={args.holds:,} active={args.active:,} repeat={args.repeat} "
              f"postgres={connection.pg_version}")
        print(f"raw aggregate of the captures:   {raw * 1000:8.1f} ms")
        print(f"recount (set_budget redefining): {ours * 1000:8.1f} ms  ratio {ours / raw:.2f}x of raw, "
              f"{ours / args.holds * 1e6:.1f} us per hold")
        print("charges add up to their periods:", "yes" if not bad else f"NO: periods {bad}")
        return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
