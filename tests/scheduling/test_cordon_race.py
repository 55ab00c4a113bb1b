"""Taking a node out of service while a scheduling pass runs, on real connections from two threads,
in the two orders that matter (forced by a hook inside the pass): once the cordon has committed and
its eviction has run, no attempt on the node is left running without a stop request.

- The cordon commits after the pass read its snapshot and before it writes: the writer re-reads the
  node and does not place there.
- The writer has read the node before the cordon: the cordon's row lock waits for the pass to
  commit, and its eviction then finds the new attempts.

Both fail without the writer's locked re-read (`writer._nodes_in_service`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from ledger.services import place_hold
from scheduling import core
from scheduling.adapter import writer
from scheduling.models import AttemptState, Job, JobAttempt, JobState, Node, NodeCordon
from scheduling.services.nodes import set_cordon
from scheduling.services.tick import run_scheduling_pass
from tests.factories import fund
from tests.lock_waits import another_session_waits

pytestmark = pytest.mark.django_db(transaction=True)

JOBS = 4


def _attempts_on(node: Node, *states: str) -> list[int]:
    live = JobAttempt.objects.filter(state__in=states, allocations__node=node,
                                     allocations__released_at__isnull=True)
    return list(live.distinct().values_list("pk", flat=True))


@pytest.mark.parametrize("order", ["cordon-mid-pass", "cordon-after-the-writer-read-the-node"])
def test_a_node_taken_out_of_service_during_a_pass_keeps_no_unstopped_attempt(
    order: str, fleet: dict[str, Any], tenant: dict[str, Any], make_job: Callable[..., Job],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = fleet["node"]
    fund(tenant["org"], 10**12)
    for i in range(JOBS):
        hold = place_hold(org=tenant["org"], amount=4_000_000, key=f"race-{i}", project=tenant["project"],
                          user=tenant["user"], gpu_types=["H100"])
        make_job(JobState.QUEUED, current_hold=hold, gpu_types=["H100"], gpu_count=1)
    cordons: list[threading.Thread] = []
    cordoned = threading.Event()
    cordon_waited: list[bool] = []

    def take_out_of_service() -> None:  # an operator, on another connection; eviction runs on commit
        try:
            set_cordon(node=node, cordon=NodeCordon.DOWN)
        finally:
            cordoned.set()
            connection.close()

    def start_cordon() -> threading.Thread:
        thread = threading.Thread(target=take_out_of_service)
        thread.start()
        cordons.append(thread)
        return thread

    if order == "cordon-mid-pass":
        decide = core.schedule

        def schedule_then_cordon(snapshot: core.Snapshot) -> core.Result:
            result = decide(snapshot)
            assert len(result.placements) == JOBS  # decided on the node while it was in service
            start_cordon().join()  # committed, and its eviction ran, before this pass writes
            return result

        monkeypatch.setattr(core, "schedule", schedule_then_cordon)
    else:
        top_up = writer.top_up_dearer

        def cordon_while_writing(*args: Any) -> Any:
            start_cordon()
            # The cordon waits for this pass (or, unlocked, commits and evicts now).
            cordon_waited.append(another_session_waits(cordoned))
            return top_up(*args)

        monkeypatch.setattr(writer, "top_up_dearer", cordon_while_writing)

    run_scheduling_pass(trigger="race")
    for thread in cordons:
        thread.join(timeout=30)
    assert len(cordons) == 1 and not cordons[0].is_alive()
    assert Node.objects.get(pk=node.pk).cordon == NodeCordon.DOWN
    assert _attempts_on(node, AttemptState.SCHEDULED, AttemptState.RUNNING) == []
    stopping = _attempts_on(node, AttemptState.STOPPING)
    if order == "cordon-mid-pass":
        assert stopping == [] and not JobAttempt.objects.exists()  # nothing placed on it
    else:
        assert cordon_waited == [True], "the cordon did not wait for the pass: no race"
        assert len(stopping) == JOBS  # placed before the cordon, then evicted by it
        assert set(JobAttempt.objects.values_list("stop_reason", flat=True)) == {"evicted"}
