"""Ledger throughput: hold -> capture -> release cycles/s, as a ratio to a raw-SQL baseline.

Run: DJANGO_SETTINGS_MODULE=config.settings.test .venv/bin/python bench/ledger.py [--seconds 5]

Creates a scratch database (gpubank_bench_<pid>) on the configured PostgreSQL server, migrates
it, measures, verifies the ledger and the audit chains, and drops it. The baseline runs in the
same process on the same database: a transaction of `SELECT ... FOR UPDATE` + `UPDATE` + `INSERT`
on one hot row, and on 100 distinct rows, with the same 8 threads.
"""

from __future__ import annotations

import argparse
import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from _scratch import scratch_database

THREADS = 8
ORGS = 100


def run_threads(work: Callable[[int, int], None], seconds: float) -> float:
    """Each thread calls work(thread, n) until time is up; returns completed calls per second."""
    from django.db import connection

    done = [0] * THREADS
    barrier = threading.Barrier(THREADS + 1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop(t: int) -> None:
        try:
            barrier.wait()
            for n in itertools.count():
                if stop.is_set():
                    break
                work(t, n)
                done[t] += 1
        except BaseException as error:
            errors.append(error)
            stop.set()
        finally:
            connection.close()

    threads = [threading.Thread(target=loop, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return sum(done) / elapsed


def raw_baseline(seconds: float, hot: bool) -> float:
    from django.db import connection, transaction

    def work(t: int, n: int) -> None:
        row = 1 if hot else random.randint(1, ORGS)
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT value FROM bench_counter WHERE id = %s FOR UPDATE", [row])
            cur.fetchone()
            cur.execute("UPDATE bench_counter SET value = value - 1 WHERE id = %s", [row])
            cur.execute("INSERT INTO bench_log (counter_id, amount) VALUES (%s, 1)", [row])

    return run_threads(work, seconds)


def ledger_cycles(seconds: float, orgs: list[Any]) -> float:
    from ledger.services import capture, place_hold, release_hold

    def work(t: int, n: int) -> None:
        org = orgs[0] if len(orgs) == 1 else random.choice(orgs)
        hold = place_hold(org=org, amount=1_000, key=f"b{t}-{n}-{time.monotonic_ns()}")
        capture(hold=hold, amount=600, key="c")
        release_hold(hold=hold)

    return run_threads(work, seconds)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()

    with scratch_database():
        from django.db import connection

        from accounts.models import Organization
        from audit.verification import verify_chains
        from ledger.models import MICRO
        from ledger.services import issue_credits
        from ledger.verification import verify_ledger

        with connection.cursor() as cur:
            cur.execute("CREATE TABLE bench_counter (id int PRIMARY KEY, value bigint NOT NULL)")
            cur.execute("CREATE TABLE bench_log (id bigserial PRIMARY KEY, counter_id int, amount bigint)")
            cur.execute(
                "INSERT INTO bench_counter SELECT g, 1000000000 FROM generate_series(1, %s) g", [ORGS]
            )
        orgs = [Organization.objects.create(name=f"bench {i}", slug=f"bench-{i}") for i in range(ORGS)]
        for org in orgs:
            issue_credits(
                org=org,
                amount=10**9 * MICRO,
                kind="paid",
                source="purchase",
                reference="bench",
                reason="benchmark funding",
            )
        connection.close()

        raw_hot = raw_baseline(args.seconds, hot=True)
        raw_distinct = raw_baseline(args.seconds, hot=False)
        hot = ledger_cycles(args.seconds, orgs[:1])
        distinct = ledger_cycles(args.seconds, orgs)
        problems = verify_ledger()
        audit_problems = verify_chains()

        print(f"threads={THREADS} seconds={args.seconds} postgres={connection.pg_version}")
        print(f"raw baseline, hot row:       {raw_hot:9.1f} tx/s")
        print(f"raw baseline, distinct rows: {raw_distinct:9.1f} tx/s")
        print(
            f"ledger cycles, hot org:      {hot:9.1f} cycles/s  "
            f"ratio {hot / raw_hot:.3f}x of raw hot-row (target >= 0.25x)"
        )
        print(
            f"ledger cycles, {ORGS} orgs:     {distinct:9.1f} cycles/s  "
            f"ratio {distinct / raw_distinct:.3f}x of raw distinct-rows, "
            f"{distinct / raw_hot:.3f}x of raw hot-row"
        )
        print("verify_ledger:", "clean" if not problems else f"{len(problems)} difference(s)")
        print("verify_audit: ", "clean" if not audit_problems else f"{len(audit_problems)} break(s)")
        return 0 if not problems and not audit_problems else 1


if __name__ == "__main__":
    raise SystemExit(main())
