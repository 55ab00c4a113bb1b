"""What an agent tells the server besides heartbeats: assignments it pulls, starts and exits.

Every function takes the authenticated node and refuses to act on an attempt that was never
allocated on it (a token grants power over its own node's attempts only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from config.clock import db_now
from config.errors import DomainError
from ledger.retry import retry_on_conflict
from metering import conf
from metering.heartbeats import HeartbeatItem, apply_usage, ensure_usage_rows, stops_for_node
from scheduling.models import Allocation, AttemptState, Job, JobAttempt, Node

# Outcomes an agent may report (docs/agent-protocol.md §5).
AGENT_OUTCOMES = frozenset(
    {"completed", "failed", "launch_failed", "preempted", "evicted", "cancelled", "out_of_credit",
     "timed_out", "lost", "refused"}
)


class AttemptNotOnNode(DomainError):
    """The attempt does not exist or never ran on the calling node."""

    type = "attempt-not-on-node"
    status = 404
    title = "No such attempt on this node"


class AttemptAlreadyEnded(DomainError):
    """A start report for an attempt the server has already ended."""

    type = "attempt-ended"
    status = 409
    title = "Attempt already ended"


class InvalidReport(DomainError):
    """A malformed agent report."""

    type = "invalid-agent-report"
    status = 400
    title = "Invalid report"


def _attempt_on_node(node: Node, attempt_id: int) -> JobAttempt:
    attempt = JobAttempt.objects.filter(pk=attempt_id).first()
    if attempt is None or not Allocation.objects.filter(attempt_id=attempt_id, node_id=node.pk).exists():
        raise AttemptNotOnNode(f"Attempt {attempt_id} is not allocated on this node.", attempt_id=attempt_id)
    return attempt


def assignments(*, node: Node) -> dict[str, list[dict[str, Any]]]:
    """Attempts to start here (with their GPUs on this node) and attempts to stop here.

    An attempt's part is listed until this node reports it started: a gang on several nodes is
    running once its first part has started, and its other nodes must still start theirs (review:
    only `scheduled` attempts were listed, so the second node of a gang never started its half)."""
    rows = (
        Allocation.objects.filter(
            node_id=node.pk, released_at__isnull=True, started_at__isnull=True,
            attempt__state__in=(AttemptState.SCHEDULED, AttemptState.RUNNING),
        )
        .values_list(
            "attempt_id",
            "gpu_index",
            "attempt__job_id",
            "attempt__job__command",
            "attempt__job__max_wall_seconds",
            "attempt__number",
        )
        .order_by("attempt_id", "gpu_index")
    )
    starts: dict[int, dict[str, Any]] = {}
    grace = conf.timeout_grace_seconds()
    for attempt_id, gpu_index, job_id, command, max_wall, number in rows:
        item = starts.setdefault(
            attempt_id,
            {
                "attempt_id": attempt_id,
                "job_id": job_id,
                "command": command,
                "gpu_indices": [],
                "max_wall_seconds": max_wall,
                "timeout_grace_seconds": grace,
                "env": {"GPUBANK_ATTEMPT_NUMBER": str(number)},
            },
        )
        item["gpu_indices"].append(gpu_index)
    if starts:
        _add_gang_env(starts, node)
    return {"start": list(starts.values()), "stop": stops_for_node(node_id=node.pk)}


def _add_gang_env(starts: dict[int, dict[str, Any]], node: Node) -> None:
    """Tell each part which nodes its gang runs on, as Slurm's SLURM_JOB_NODELIST / SLURM_NODEID
    do (a distributed launcher needs its peers and its rank): `GPUBANK_NODES` (names in rank order,
    comma-separated), `GPUBANK_NUM_NODES`, `GPUBANK_NODE_RANK` (this node's place in the list)."""
    nodes: dict[int, list[str]] = {}
    rows = (Allocation.objects.filter(attempt_id__in=list(starts)).values_list("attempt_id", "node__name")
            .distinct().order_by("attempt_id", "node__name"))
    for attempt_id, name in rows:
        nodes.setdefault(attempt_id, []).append(name)
    for attempt_id, item in starts.items():
        names = nodes.get(attempt_id) or [node.name]
        item["env"].update({"GPUBANK_NODES": ",".join(names), "GPUBANK_NUM_NODES": str(len(names)),
                            "GPUBANK_NODE_RANK": str(names.index(node.name))})


def report_started(*, node: Node, attempt_id: int) -> JobAttempt:
    """The agent spawned the attempt: running from now (DB clock), with a usage row to meter into."""
    from scheduling.services.lifecycle import mark_attempt_started

    attempt = _attempt_on_node(node, attempt_id)
    if attempt.state == AttemptState.ENDED:
        raise AttemptAlreadyEnded(f"Attempt {attempt_id} has ended.", attempt_id=attempt_id)
    with transaction.atomic():
        attempt = mark_attempt_started(attempt=attempt)
        if attempt.state == AttemptState.ENDED:  # ended (withdrawn, say) while we waited for its lock
            raise AttemptAlreadyEnded(f"Attempt {attempt_id} has ended.", attempt_id=attempt_id)
        # This node's part runs (a gang's parts start apart).
        Allocation.objects.filter(attempt_id=attempt.pk, node_id=node.pk, started_at__isnull=True,
                                  released_at__isnull=True).update(started_at=db_now())
        ensure_usage_rows(node_id=node.pk, attempt_ids=[attempt.pk])
    return attempt


@dataclass(frozen=True)
class ExitReport:
    """The body of POST /attempts/<id>/exit."""

    seq: int
    cumulative_gpu_ms: int
    outcome: str
    exit_code: int | None = None
    signal: int | None = None


@dataclass(frozen=True)
class ExitResult:
    """What the server did with an exit report."""

    attempt_id: int
    job_state: str
    outcome: str
    duplicate: bool


@retry_on_conflict()
def report_exit(*, node: Node, attempt_id: int, report: ExitReport) -> ExitResult:
    """Apply the final usage and end the attempt (settlement + requeue or terminal, in lifecycle).

    Idempotent by attempt: a repeat, or a late report for an attempt reconciliation already settled
    (lost node), changes nothing and is answered like the first one.
    """
    from scheduling.services.lifecycle import end_gang_part, finish_attempt

    if report.outcome not in AGENT_OUTCOMES:
        raise InvalidReport(f"Unknown outcome {report.outcome!r}.", outcome=report.outcome)
    attempt = _attempt_on_node(node, attempt_id)
    with transaction.atomic():
        # Lock order: job -> attempt (then hold, inside settlement).
        job = Job.objects.select_for_update(of=("self",)).get(pk=attempt.job_id)
        attempt = JobAttempt.objects.select_for_update().get(pk=attempt_id)
        if attempt.state == AttemptState.ENDED:
            return ExitResult(attempt_id, job.state, attempt.outcome, duplicate=True)
        mine = Allocation.objects.filter(attempt_id=attempt_id, node_id=node.pk, released_at__isnull=True)
        if not mine.exists():  # this node's part of a gang has exited already: a repeat
            return ExitResult(attempt_id, job.state, attempt.first_part_outcome or report.outcome,
                              duplicate=True)
        if attempt.started_at is not None:
            ensure_usage_rows(node_id=node.pk, attempt_ids=[attempt_id])
            item = HeartbeatItem(attempt_id, report.seq, report.cumulative_gpu_ms)
            apply_usage(node_id=node.pk, items=[item])
        outcome = report.outcome
        if outcome == "refused":
            outcome = _refused(attempt, node)
        code = report.exit_code
        if end_gang_part(attempt=attempt, node_id=node.pk, outcome=outcome, exit_code=code):
            return ExitResult(attempt_id, job.state, outcome, duplicate=False)
        job = finish_attempt(attempt=attempt, outcome=outcome, exit_code=code)
        attempt.refresh_from_db()
        return ExitResult(attempt_id, job.state, attempt.outcome, duplicate=False)


def _refused(attempt: JobAttempt, node: Node) -> str:
    """The agent refused to start the attempt (its GPUs are not on the node: the inventory and the
    server's view disagree). The node's fault, not the job's: the attempt ends `refused` (requeued
    at once, no retry spent; it spent one as `lost`), and the node is drained after the commit, so
    the job is not placed there again until an operator has looked (Slurm drains a node whose
    configuration does not match). One that ran here already is `lost`."""
    if attempt.started_at is not None:
        return "lost"
    # After the commit, in its own transaction: the node row is not locked among the ledger locks.
    transaction.on_commit(lambda: _drain_if_in_service(node.pk), robust=True)
    return "refused"


@transaction.atomic
def _drain_if_in_service(node_id: int) -> None:
    from scheduling.models import NodeCordon
    from scheduling.services.nodes import set_cordon

    node = Node.objects.select_for_update().get(pk=node_id)
    if node.cordon == NodeCordon.NONE:  # an operator's drain or out-of-service cordon stays
        set_cordon(node=node, cordon=NodeCordon.DRAIN, why="start-refused")
