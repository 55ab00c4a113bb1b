"""Drills 4 and 5: heartbeats replayed/duplicated/shuffled (Hypothesis), and out of credit mid-run
while the same org submits concurrently (real threads, real PostgreSQL)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.db.models import Sum
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config.errors import DomainError
from ledger.models import MICRO, Bucket, Hold, HoldState
from ledger.verification import verify_ledger
from metering.charging import lookahead_cost
from metering.heartbeats import HeartbeatItem
from metering.models import AttemptUsage
from metering.services import ExitReport, charge_progress, ingest_heartbeats, report_exit, settle_attempt
from scheduling.models import Allocation, AttemptState, Job, JobAttempt, JobState
from tests.metering.conftest import World, mark_node_alive, place_pending, shift_started

# -- 4. heartbeats replayed, duplicated and shuffled ------------------------------------------

increments = st.lists(st.integers(min_value=0, max_value=50_000), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=increments, data=st.data())
def test_drill4_replayed_duplicated_shuffled_heartbeats_bill_the_same(
    world: World, funded: Any, make_attempt: Callable[..., JobAttempt], steps: list[int], data: st.DataObject
) -> None:
    if not Bucket.objects.filter(org=world.org).exists():
        funded(1_000 * MICRO)
    cumulative = [sum(steps[: i + 1]) for i in range(len(steps))]
    sent = [HeartbeatItem(0, seq, ms, float(seq % 100), seq) for seq, ms in enumerate(cumulative, start=1)]
    # The network's version: every heartbeat at least once, some many times, in any order, batched.
    extra = data.draw(st.lists(st.sampled_from(sent), max_size=40), label="duplicates")
    delivered = data.draw(st.permutations(sent + extra), label="order")
    cuts = sorted(data.draw(st.sets(st.integers(0, len(delivered)), max_size=6), label="batches"))

    in_order = make_attempt(gpus=(0,), started_ago=7200)
    chaotic = make_attempt(gpus=(1,), started_ago=7200)
    for item in sent:
        ingest_heartbeats(
            node=world.node,
            items=[
                HeartbeatItem(
                    in_order.pk, item.seq, item.cumulative_gpu_ms, item.gpu_utilization, item.memory_used_mb
                )
            ],
        )
    bounds = [0, *cuts, len(delivered)]
    for lo, hi in itertools.pairwise(bounds):
        batch = [
            HeartbeatItem(chaotic.pk, i.seq, i.cumulative_gpu_ms, i.gpu_utilization, i.memory_used_mb)
            for i in delivered[lo:hi]
        ]
        ingest_heartbeats(node=world.node, items=batch)

    def state(attempt: JobAttempt) -> tuple[Any, ...]:
        u = AttemptUsage.objects.get(pk=attempt.pk)
        return (u.last_seq, u.reported_gpu_ms, u.billable_gpu_ms, u.gpu_utilization, u.memory_used_mb)

    assert (
        state(chaotic)
        == state(in_order)
        == (len(sent), cumulative[-1], cumulative[-1], float(len(sent) % 100), len(sent))
    )
    billed = [settle_attempt(attempt=a, outcome="completed").captured for a in (in_order, chaotic)]
    assert billed[0] == billed[1] == cumulative[-1]  # 1 micro-credit per GPU-ms at this rate
    # Free the GPUs for the next example.
    JobAttempt.objects.filter(pk__in=[in_order.pk, chaotic.pk]).update(state=AttemptState.ENDED)
    Allocation.objects.filter(attempt__in=[in_order, chaotic]).update(released_at=timezone.now())


# -- 5. out of credit mid-run with concurrent submissions --------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_drill5_out_of_credit_mid_run_with_concurrent_submissions_never_overspends(
    world: World, funded: Any, submit: Callable[..., Job]
) -> None:
    # Holds cover 10-minute windows (org policy) and are renewed window by window.
    world.org.hold_window_seconds = 600
    world.org.save(update_fields=["hold_window_seconds"])
    window = 2 * 600 * 1000  # 1,200,000 micro-credits per 2-GPU window
    granted = 6 * MICRO
    funded(granted)
    mark_node_alive(world.node)
    job = submit(gpus=2, max_wall_seconds=36_000)
    [attempt] = place_pending()
    from metering.services import report_started

    report_started(node=world.node, attempt_id=attempt.pk)
    shift_started(attempt, 36_000)  # the cap never binds here; the hold does
    errors: list[BaseException] = []
    outcomes: list[str] = []
    extended: list[int] = []
    used = 0

    def submitter() -> None:
        try:
            submit(gpus=2, max_wall_seconds=600)
            outcomes.append("held")
        except DomainError as refusal:
            outcomes.append(refusal.type)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def charger() -> None:
        try:
            extended.append(charge_progress(attempt=attempt).extended)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    for _ in range(10):  # the running job eats its hold window by window, racing the submissions
        hold = Hold.objects.get(pk=attempt.hold_id)
        used = hold.authorized - 50_000  # nearly all of what is held so far
        ingest_heartbeats(node=world.node, items=[HeartbeatItem(attempt.pk, used, used)])
        threads = [threading.Thread(target=submitter) for _ in range(3)] + [threading.Thread(target=charger)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        attempt.refresh_from_db()
        if attempt.state == AttemptState.STOPPING:
            break
    assert attempt.state == AttemptState.STOPPING and attempt.stop_reason == "out_of_credit"
    # It was stopped because the org ran dry (submissions won the race for the last credits),
    # not for any other reason: what is left cannot bring the hold back up to the look-ahead.
    left = Bucket.objects.filter(org=world.org).aggregate(a=Sum("available"))["a"]
    at_stop = Hold.objects.get(pk=attempt.hold_id)
    assert at_stop.remaining < lookahead_cost(attempt) and left < lookahead_cost(attempt) - at_stop.remaining
    assert outcomes.count("held") >= 1 and set(outcomes) <= {"held", "insufficient-credits"}

    # The agent stops the job and reports; it ends out_of_credit and settles exactly.
    report_exit(
        node=world.node,
        attempt_id=attempt.pk,
        report=ExitReport(seq=used + 1, cumulative_gpu_ms=used + 10_000, outcome="out_of_credit"),
    )
    job.refresh_from_db()
    hold = Hold.objects.get(pk=attempt.hold_id)
    assert job.state == JobState.FAILED and job.end_reason == "out_of_credit"
    assert hold.state == HoldState.SETTLED and hold.captured == min(used + 10_000, hold.authorized)
    # No overspend: the org's buckets never went below zero and every credit is accounted for.
    totals = Bucket.objects.filter(org=world.org).aggregate(
        a=Sum("available"), h=Sum("held"), s=Sum("spent"), e=Sum("expired")
    )
    assert min(totals.values()) >= 0
    assert totals["a"] + totals["h"] + totals["s"] + totals["e"] == granted
    active = Hold.objects.filter(org=world.org, state=HoldState.ACTIVE).aggregate(t=Sum("authorized"))["t"]
    assert (active or 0) + totals["s"] + totals["a"] == granted
    # Renewed window by window, zero or more times depending on who won the race for the credits
    # (a window's cost includes the 1% metering tolerance), or by less when a window could not be
    # funded: the least that covered the look-ahead.
    assert hold.authorized - window == sum(extended)
    assert all(0 <= amount <= window * 101 // 100 for amount in extended)
    assert verify_ledger() == []
