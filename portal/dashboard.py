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


def _fleet() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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
                "state": node.state,
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


def build_snapshot() -> Snapshot:
    """Everything the dashboard shows, for every org (cut down per viewer by `for_scope`)."""
    nodes, gpu_types = _fleet()
    consumption = [
        {**row, "display": credits(row["amount"])} for row in selectors.consumption_by_org()
    ]
    return {
        "generated_at": db_now().isoformat(),
        "running_jobs": _running_jobs(),
        "nodes": nodes,
        "gpu_types": gpu_types,
        "consumption": consumption,
    }


def for_scope(snapshot: Snapshot, scope: DashboardScope) -> Snapshot:
    """The part of a snapshot a viewer may see: fleet capacity is shared, jobs and money per org."""
    if scope.all_orgs:
        jobs, consumption = snapshot["running_jobs"], snapshot["consumption"]
    else:
        jobs = [job for job in snapshot["running_jobs"] if scope.allows(job["org_id"])]
        consumption = [row for row in snapshot["consumption"] if scope.allows(row["org_id"])]
    total = sum(row["amount"] for row in consumption)
    return {
        **snapshot,
        "running_jobs": jobs,
        "consumption": consumption,
        "consumed_total": total,
        "consumed_total_display": credits(total),
    }
