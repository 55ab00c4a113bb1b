"""Review of e995fba on real connections: `end_gang_part` stamped `gang_base_at` with `db_now()`,
the *transaction's start*, though the base it records is the billable usage read after the exit's
lock waits. A straggler's heartbeat committed during the wait was in the base (x2: the first
part's GPUs were still allocated) and its seconds were counted again as the straggler's extra from
`gang_base_at`. Now stamped with `db_wall_clock` (config/clock.py: for a decision made after a
lock wait)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import transaction

from metering.heartbeats import HeartbeatItem
from metering.models import AttemptUsage
from metering.reports import ExitReport, report_exit
from metering.services import ingest_heartbeats
from scheduling.models import Job
from tests.lock_waits import another_session_waits
from tests.metering import test_gang_parts
from tests.metering.conftest import shift_started
from tests.metering.test_gang_parts import _start_both
from tests.threads import Worker

gang = test_gang_parts.gang  # the two-node gang fixture
pytestmark = pytest.mark.django_db(transaction=True)

WAIT_S = 3


def test_seconds_a_straggler_reported_while_the_first_exit_waited_for_a_lock_are_not_billed_twice(
    gang: Any,
) -> None:
    attempt, (first, second), nodes = gang
    _start_both(attempt, [first, second])
    shift_started(attempt, 600)
    locked, release = threading.Event(), threading.Event()

    def hold_the_job() -> None:  # as a charge tick or a scheduling pass would
        with transaction.atomic():
            Job.objects.select_for_update().get(pk=attempt.job_id)
            locked.set()
            release.wait(30)

    holder = Worker(hold_the_job).start()
    assert locked.wait(10)
    exiter = Worker(lambda: report_exit(node=nodes[0], attempt_id=attempt.pk, report=ExitReport(
        seq=1, cumulative_gpu_ms=4 * 600_000, outcome="completed", exit_code=0))).start()
    assert another_session_waits(exiter.done)  # A's exit has begun its transaction, waits for the job
    time.sleep(WAIT_S)
    # B reports meanwhile: A's GPUs are still the gang's, so x2: 8 GPUs x 603 s
    assert ingest_heartbeats(node=nodes[1], items=[HeartbeatItem(attempt.pk, 1, 4 * 603_000)]).accepted
    release.set()
    holder.join()
    exiter.join()
    assert holder.errors == exiter.errors == []
    usage = AttemptUsage.objects.get(attempt=attempt)
    assert usage.gang_base_gpu_ms >= 8 * 603_000  # the base holds B's report from after the wait
    # B exits right away (stopped): it ran on alone for well under a second after A's GPUs went
    report_exit(node=nodes[1], attempt_id=attempt.pk, report=ExitReport(
        seq=2, cumulative_gpu_ms=4 * 603_500, outcome="cancelled", signal=15))
    attempt.hold.refresh_from_db()
    extra = attempt.hold.captured - usage.gang_base_gpu_ms
    assert extra < 4 * 1_000, (
        f"{extra} GPU-ms billed for B after the base, whose {WAIT_S} s (lock wait) B's x2 report "
        "had already billed on all 8 GPUs: counted twice")
