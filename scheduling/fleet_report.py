"""What users read about the fleet and their quotas.

`gpu_types()`: the GPU types on offer, each with its memory, its price now (and the next one when
finance has scheduled it), its regions and its capacity: nodes by the state the scheduler sees,
GPUs ready, in use and free, and the largest gang free on one node now (Slurm's `sinfo`).

`org_quotas()`: an org's concurrent-GPU quotas, each with the GPUs its jobs use now and the queued
demand that could run on the type (Kueue's ClusterQueue status: usage against nominal quota,
pending workloads). "In use" counts the same attempts a scheduling pass counts against a quota.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db.models import Count, Q, Sum

from accounts.models import Organization
from config.clock import db_now
from scheduling.adapter.snapshot import LIVE
from scheduling.models import (
    Allocation,
    GpuPrice,
    GpuType,
    Job,
    JobAttempt,
    JobState,
    Node,
    scheduling_state_at,
)

NODE_STATES = ("ready", "draining", "unknown", "down")


def _prices(now: datetime) -> dict[int, dict[str, Any]]:
    """{type id: {price now, since when, the next scheduled price or None}}."""
    out: dict[int, dict[str, Any]] = {}
    for type_id, price, since in GpuPrice.objects.order_by("gpu_type_id", "effective_from").values_list(
        "gpu_type_id", "price_per_gpu_hour", "effective_from"
    ):
        entry = out.setdefault(type_id, {"price": None, "since": None, "next": None})
        if since <= now:
            entry.update(price=price, since=since)
        elif entry["next"] is None:
            entry["next"] = {"price_per_gpu_hour": price, "effective_from": since}
    return out


def gpu_types() -> list[dict[str, Any]]:
    now = db_now()
    prices = _prices(now)
    in_use = dict(
        Allocation.objects.filter(released_at__isnull=True)
        .values("node_id").annotate(n=Count("id")).values_list("node_id", "n")
    )
    per_type: dict[int, dict[str, Any]] = defaultdict(
        lambda: {"nodes": dict.fromkeys(NODE_STATES, 0), "regions": set(), "gpus": 0, "ready_gpus": 0,
                 "in_use_gpus": 0, "free_gpus": 0, "largest_free_on_one_node": 0}
    )
    for node_id, type_id, region, count, state, cordon, start, end in Node.objects.values_list(
        "id", "gpu_type_id", "region__code", "gpu_count", "state", "cordon", "maintenance_from",
        "maintenance_until",
    ):
        entry = per_type[type_id]
        seen = scheduling_state_at(state, cordon, now, start, end)
        entry["nodes"][seen] += 1
        entry["regions"].add(region)
        entry["gpus"] += count
        used = in_use.get(node_id, 0)
        entry["in_use_gpus"] += used
        if seen == "ready":
            entry["ready_gpus"] += count
            free = max(count - used, 0)
            entry["free_gpus"] += free
            entry["largest_free_on_one_node"] = max(entry["largest_free_on_one_node"], free)
    rows = []
    for gpu_type in GpuType.objects.order_by("name"):
        price = prices.get(gpu_type.pk, {"price": None, "since": None, "next": None})
        capacity = per_type[gpu_type.pk]
        rows.append({
            "name": gpu_type.name,
            "memory_gb": gpu_type.memory_gb,
            "price_per_gpu_hour": price["price"],
            "price_effective_from": price["since"],
            "next_price": price["next"],
            **capacity,
            "regions": sorted(capacity["regions"]),
        })
    return rows


def _accepts(gpu_types: list[str], memory_floor: int, gpu_type: GpuType) -> bool:
    """Whether a job asking for these types (empty: any) and this memory could run on the type."""
    return (not gpu_types or gpu_type.name in gpu_types) and gpu_type.memory_gb >= memory_floor


def org_quotas(org: Organization, projects: set[int] | None) -> list[dict[str, Any]]:
    """The org's quotas (and its projects' quotas, only those in `projects` unless it is None),
    org-wide ones first, by GPU type then project."""
    quotas = org.quotas.select_related("gpu_type", "project")
    if projects is not None:
        quotas = quotas.filter(Q(project__isnull=True) | Q(project_id__in=projects))
    quotas = sorted(quotas, key=lambda q: (q.project_id is not None, q.gpu_type.name, q.project_id or 0))
    if not quotas:
        return []
    used: dict[tuple[int | None, int], int] = defaultdict(int)  # (project or None, type id) -> GPUs
    for project_id, type_id, gpus in (
        JobAttempt.objects.filter(org_id=org.pk, state__in=LIVE)
        .values("job__project_id", "gpu_type_id").annotate(gpus=Sum("gpu_count"))
        .values_list("job__project_id", "gpu_type_id", "gpus")
    ):
        used[(project_id, type_id)] += gpus
        used[(None, type_id)] += gpus
    queued = list(
        Job.objects.filter(org=org, state=JobState.QUEUED)
        .values_list("project_id", "gpu_types", "gpu_memory_gb", "gpu_count")
    )
    rows = []
    for quota in quotas:
        demand = [
            gpus for project_id, types, memory, gpus in queued
            if (quota.project_id is None or project_id == quota.project_id)
            and _accepts(types or [], memory, quota.gpu_type)
        ]
        in_use = used[(quota.project_id, quota.gpu_type_id)]
        rows.append({
            "gpu_type": quota.gpu_type.name,
            "project": quota.project_id,
            "project_slug": quota.project.slug if quota.project else None,
            "max_gpus": quota.max_gpus,
            "in_use_gpus": in_use,
            "available_gpus": max(quota.max_gpus - in_use, 0),
            "queued_jobs": len(demand),
            "queued_gpus": sum(demand),
        })
    return rows
