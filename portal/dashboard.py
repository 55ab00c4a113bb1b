"""The live dashboard's snapshot: built once from selectors, then cut down per viewer.

A snapshot is plain JSON (ints for money, pre-formatted strings for display) so it can travel
through the channel layer and straight to the browser.
"""

from collections import defaultdict
from typing import Any

from config.clock import db_now
from portal import selectors
from portal.access import DashboardScope
from portal.templatetags.portal_money import credits
from scheduling.core.reasons import RESERVED_PREFIX
from scheduling.models import NodeCordon, NodeState, in_maintenance

Snapshot = dict[str, Any]


def _running_jobs() -> list[dict[str, Any]]:
    jobs = []
    for attempt in selectors.running_attempts():
        job = attempt.job
        usage = getattr(attempt, "usage", None)
        jobs.append(
            {
                "id": job.id,
                "name": job.name,
                "org_id": job.org_id,
                "org": job.org.slug,
                "project": job.project.slug,
                "user": job.user.get_username(),
                "state": attempt.state,
                "gpu_type": attempt.gpu_type.name,
                "gpu_count": attempt.gpu_count,
                "started_at": attempt.started_at.isoformat() if attempt.started_at else None,
                "gpu_hours": round((usage.billable_gpu_ms if usage else 0) / 3_600_000, 2),
                "utilization": usage.gpu_utilization if usage else None,
            }
        )
    return jobs


def _node_state(node: Any, now: Any) -> str:
    """Health, unless an operator drained the node, took it out of service or it is inside its
    maintenance window (the scheduler then treats a ready node as draining)."""
    if node.cordon == NodeCordon.DOWN:
        return "out-of-service"
    if node.cordon == NodeCordon.DRAIN:
        return "draining" if node.state == NodeState.READY else f"{node.state}, draining"
    if in_maintenance(now, node.maintenance_from, node.maintenance_until):
        return "maintenance" if node.state == NodeState.READY else f"{node.state}, maintenance"
    return node.state


def _fleet(now: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    utilization = selectors.node_utilization()
    nodes = []
    by_type: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"gpus": 0, "allocated": 0, "util_sum": 0.0, "util_gpus": 0}
    )
    for node in selectors.node_usage():
        util = utilization.get(node.id)
        nodes.append(
            {
                "name": node.name,
                "gpu_type": node.gpu_type.name,
                "state": _node_state(node, now),
                "gpus": node.gpu_count,
                "allocated": node.allocated,
                "utilization": round(util, 1) if util is not None else None,
            }
        )
        totals = by_type[node.gpu_type.name]
        totals["gpus"] += node.gpu_count
        totals["allocated"] += node.allocated
        if util is not None:
            totals["util_sum"] += util * node.allocated
            totals["util_gpus"] += node.allocated
    gpu_types = [
        {
            "name": name,
            "gpus": totals["gpus"],
            "allocated": totals["allocated"],
            "utilization": (
                round(totals["util_sum"] / totals["util_gpus"], 1) if totals["util_gpus"] else None
            ),
        }
        for name, totals in sorted(by_type.items())
    ]
    return nodes, gpu_types


# Per-job reservation codes (`reserved-for-job-N`) are one family on the dashboard.
RESERVED_FAMILY = f"{RESERVED_PREFIX}N"
NOT_YET_SEEN = "new"  # queued, not yet looked at by a scheduling pass


def _queue(now_epoch: float) -> list[dict[str, Any]]:
    rows = []
    for row in selectors.queue_by_org_and_reason():
        reason = row["reason"] or NOT_YET_SEEN
        if reason.startswith(RESERVED_PREFIX):
            reason = RESERVED_FAMILY
        waited = max(int(now_epoch - row["oldest"].timestamp()), 0)
        rows.append({"org_id": row["org_id"], "reason": reason, "jobs": row["jobs"],
                     "gpus": row["gpus"], "longest_wait_seconds": waited})
    return rows


def _queue_by_reason(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Org rows merged per reason, the reason with the most waiting jobs first."""
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:
        entry = merged.setdefault(
            row["reason"], {"reason": row["reason"], "jobs": 0, "gpus": 0, "longest_wait_seconds": 0}
        )
        entry["jobs"] += row["jobs"]
        entry["gpus"] += row["gpus"]
        entry["longest_wait_seconds"] = max(entry["longest_wait_seconds"], row["longest_wait_seconds"])
    return sorted(merged.values(), key=lambda entry: (-entry["jobs"], entry["reason"]))


def build_snapshot() -> Snapshot:
    """Everything the dashboard shows, for every org (cut down per viewer by `for_scope`)."""
    now = db_now()
    nodes, gpu_types = _fleet(now)
    consumption = [
        {**row, "display": credits(row["amount"])} for row in selectors.consumption_by_org()
    ]
    return {
        "generated_at": now.isoformat(),
        "running_jobs": _running_jobs(),
        "nodes": nodes,
        "gpu_types": gpu_types,
        "gpus_in_use_last_hour": selectors.gpus_in_use_series(),
        "consumption": consumption,
        "queue_rows": _queue(now.timestamp()),
    }


def for_scope(snapshot: Snapshot, scope: DashboardScope) -> Snapshot:
    """The part of a snapshot a viewer may see: fleet capacity is shared, jobs and money per org."""
    if scope.all_orgs:
        jobs, consumption = snapshot["running_jobs"], snapshot["consumption"]
        queue = snapshot["queue_rows"]
    else:
        jobs = [job for job in snapshot["running_jobs"] if scope.allows(job["org_id"])]
        consumption = [row for row in snapshot["consumption"] if scope.allows(row["org_id"])]
        queue = [row for row in snapshot["queue_rows"] if scope.allows(row["org_id"])]
    total = sum(row["amount"] for row in consumption)
    view = {key: value for key, value in snapshot.items() if key != "queue_rows"}
    return {
        **view,
        "running_jobs": jobs,
        "consumption": consumption,
        "queue": _queue_by_reason(queue),
        "consumed_total": total,
        "consumed_total_display": credits(total),
    }
