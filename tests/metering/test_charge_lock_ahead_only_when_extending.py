"""Review of ffc5ec7 (`charging._may_extend` / `lock_ahead_for_extension` in `charge_progress`).

`_may_extend` predicts an extension from "what is left after the capture is below the low-water
mark" only. `charge_progress` then also gives up when `extension_amount` is 0: the hold already pays
for `max_cost` (max wall + the longest stop grace, x 1.01 + slack), which is the case for every
hold placed for the whole run once it has been topped up to `max_cost`, for the rest of the run.
In that state every charge tick (once per METERING_CHARGE_INTERVAL_S) still takes every
unexpired bucket of the org, and its current budget periods, FOR UPDATE, and extends nothing:
for a job whose hold is large, the last 10 % of its run (METERING_EXTEND_WHEN_LEFT_PERCENT of
what the hold pays for; e.g. ~17 h, ~1,000 ticks, of a 7-day job) serialises with every
submission, charge and settlement of the org, and waits for any of them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from ledger.models import MICRO, Bucket
from metering.charging import Action, charge_progress, max_cost
from metering.models import AttemptUsage
from scheduling.models import Job, JobAttempt
from tests.metering.conftest import H100_RATE, World
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def _hold_the_bucket(bucket_id: int) -> tuple[Worker, threading.Event]:
    """Another transaction of the org (a submission, another job's charge) holding one bucket."""
    locked, release = threading.Event(), threading.Event()

    def other_writer_of_the_org() -> None:
        with transaction.atomic():
            list(Bucket.objects.select_for_update().filter(pk=bucket_id).values_list("pk"))
            locked.set()
            release.wait(30)

    blocker = Worker(other_writer_of_the_org).start()
    assert locked.wait(10)
    return blocker, release


@pytest.mark.parametrize("wall", [600, 36_000], ids=["short-lookahead-rule", "long-10-percent-rule"])
def test_a_charge_that_cannot_extend_does_not_lock_the_orgs_other_buckets(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt], wall: int
) -> None:
    funded(1_000 * MICRO)
    gpus = (0, 1)
    # A hold that already pays for the most the attempt can ever bill (max_cost): no extension
    # can ever be made for it (`extension_amount` is 0), whatever is left.
    running = JobAttempt(gpu_count=len(gpus), rate_per_gpu_hour=H100_RATE)
    ceiling = max_cost(running, Job(max_wall_seconds=wall))
    attempt = make_attempt(hold_amount=ceiling, gpus=gpus, max_wall_seconds=wall, started_ago=wall)
    # 92 % used: what is left (8 %) is under the 10 % low-water mark, and above the look-ahead
    # for the long job.
    used = ceiling * 92 // 100  # 1 micro-credit per GPU-ms at the H100 rate
    AttemptUsage.objects.filter(attempt=attempt).update(reported_gpu_ms=used, billable_gpu_ms=used)
    other = funded(1 * MICRO)  # another of the org's buckets, not one the hold draws on
    blocker, release = _hold_the_bucket(other.pk)

    def charge() -> Any:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '2s'")
            return charge_progress(attempt=attempt)

    try:
        worker = Worker(charge).start().join()
    finally:
        release.set()
        blocker.join()
    # Today: LockNotAvailable (canceling statement due to lock timeout) on the other bucket,
    # taken by `lock_ahead_for_extension` for an extension that `charge_progress` never tries.
    assert worker.errors == [], worker.errors
    assert worker.result.actions == (Action.CAPTURED,)
