"""Review (session 14): a windowed hold partly released at placement (placed on a cheaper type
than it was priced for) was never extended: extension_amount capped by `max_cost -
hold.authorized`, and `authorized` still counts the released excess. The run went on unpaid,
never stopped, while its org had the funds."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from ledger.models import MICRO, Hold
from metering.charging import Action
from metering.heartbeats import HeartbeatItem
from metering.services import charge_progress, ingest_heartbeats, report_started
from scheduling.models import GpuPrice, GpuType, JobAttempt, Node, NodeState
from scheduling.services.submission import JobSpec, submit_job
from tests.factories import MembershipFactory
from tests.metering.conftest import World, place_pending, shift_started

A100_RATE = 900_000  # a quarter of H100's


def _running_on_a100(world: World, funded: Any) -> tuple[Node, JobAttempt]:
    """A 1-GPU job of a 1,800 s-window org, held at H100's price and placed on the only ready
    node, an A100 a quarter of the price (the excess given back at placement); started."""
    funded(100 * MICRO)  # plenty: any extension would be granted
    world.org.hold_window_seconds = 1800
    world.org.save(update_fields=["hold_window_seconds"])
    a100 = GpuType.objects.create(name="A100", memory_gb=80)
    GpuPrice.objects.create(gpu_type=a100, price_per_gpu_hour=A100_RATE,
                            effective_from=timezone.now() - timedelta(days=30))
    Node.objects.filter(pk=world.node.pk).update(state=NodeState.DOWN)
    node = Node.objects.create(name="a100-1", region=world.region, gpu_type=a100, gpu_count=8,
                               state=NodeState.READY, last_heartbeat_at=timezone.now())
    MembershipFactory(project=world.project, user=world.user)
    spec = JobSpec(name="j", gpu_types=("H100", "A100"), gpu_count=1, max_wall_seconds=3600,
                   priority_class="standard", command="sleep 1")
    submit_job(user=world.user, project=world.project, spec=spec, idempotency_key="k1")
    [attempt] = place_pending()
    assert attempt.rate_per_gpu_hour == A100_RATE
    report_started(node=node, attempt_id=attempt.pk)
    shift_started(attempt, 3600)
    return node, attempt


def test_windowed_hold_released_at_placement_is_extended(world: World, funded: Any) -> None:
    node, attempt = _running_on_a100(world, funded)
    hold = Hold.objects.get(pk=attempt.hold_id)
    assert hold.remaining == 1800 * 1000 * A100_RATE // 3_600_000  # the window at A100's price

    # 1700 s used: 100 s of the window left, less than the look-ahead. The org can pay.
    ingest_heartbeats(node=node, items=[HeartbeatItem(attempt.pk, 1, 1_700_000)])
    result = charge_progress(attempt=attempt)
    hold.refresh_from_db()
    # The run has 1900 s of max wall left and its hold pays for 100 s of it: extended (the org has
    # the funds); it was neither extended nor stopped.
    assert Action.EXTENDED in result.actions, result


def test_the_whole_run_is_paid(world: World, funded: Any) -> None:
    """Same set-up; run it to its max wall time, charging every 60 s, and exit."""
    from audit.models import AuditEvent
    from metering.reports import ExitReport, report_exit

    node, attempt = _running_on_a100(world, funded)
    seq = 0
    for used in range(60, 3601, 60):
        seq += 1
        ingest_heartbeats(node=node, items=[HeartbeatItem(attempt.pk, seq, used * 1000)])
        charge_progress(attempt=attempt)
    report_exit(node=node, attempt_id=attempt.pk,
                report=ExitReport(seq=seq + 1, cumulative_gpu_ms=3_600_000, outcome="timed_out"))
    hold = Hold.objects.get(pk=attempt.hold_id)
    due = 3_600_000 * A100_RATE // 3_600_000
    ev = AuditEvent.objects.filter(data__has_key="unfunded").order_by("-pk").first()
    assert hold.captured == due  # the org had the funds: the whole run is paid
    assert ev is None or not ev.data.get("unfunded")
