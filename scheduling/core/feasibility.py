"""Could a job ever run? Its gang against the whole fleet idle, and its size against its quotas.

A submission that no node set could ever hold (more GPUs than any node or IB group of its types
has, or no node of its types in its regions), or that is larger than a concurrent-GPU quota on
every type it accepts, would wait forever with its credits held. The API refuses it instead, with
the reason per type; this module gives that reason by the same placement rules the scheduler uses
(`FleetState.find` on a fleet where every node is ready and idle).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from scheduling.core.model import Node, Quotas
from scheduling.core.placement import FleetState


def idle_fleet(nodes: Iterable[Node]) -> FleetState:
    """Every node (whatever its state now: a down node may come back) ready with all GPUs free."""
    idle = [replace(n, state="ready", free_gpu_indices=frozenset(range(n.gpu_count))) for n in nodes]
    return FleetState(idle, ())


@dataclass(frozen=True, slots=True)
class Never:
    """Why a job can never run on one GPU type; `cause` names what to change: "type" (no such
    nodes at all), "regions" (none in the job's regions) or "size" (too many GPUs)."""

    cause: str
    message: str


def why_never_fits(
    fleet: FleetState, gpu_type: str, gpu_count: int, regions: tuple[str, ...]
) -> Never | None:
    """None when a gang of `gpu_count` GPUs of `gpu_type` fits the idle `fleet` in `regions`
    (empty = any), else why it never can."""
    if gpu_type in fleet.max_gpus and fleet.is_multi(gpu_type, gpu_count):
        # A group whose GPUs add up to the gang always fits it (pick_in_group takes whole nodes
        # until the rest fits one), so the totals decide without building an allocation.
        totals = (fleet.group_free[g] for g in fleet.groups_of[gpu_type]
                  if not regions or fleet.group_region[g] in regions)
        if any(total >= gpu_count for total in totals):
            return None
    elif fleet.find(gpu_type, gpu_count, regions) is not None:
        return None
    if gpu_type not in fleet.max_gpus:
        return Never("type", f"there are no {gpu_type} nodes")
    where = f" in {', '.join(regions)}" if regions else ""
    nodes = [n for n in fleet.node.values()
             if n.gpu_type == gpu_type and (not regions or n.region in regions)]
    if not nodes:
        return Never("regions", f"there are no {gpu_type} nodes{where}")
    if not fleet.is_multi(gpu_type, gpu_count):
        # A node of the type somewhere is big enough, but none in the allowed regions.
        largest = max(n.gpu_count for n in nodes)
        return Never("size", f"{gpu_count} GPUs must fit one {gpu_type} node and the largest{where} "
                             f"has {largest}")
    groups = [g for g in fleet.groups_of[gpu_type] if not regions or fleet.group_region[g] in regions]
    return Never("size", f"{gpu_count} GPUs need {gpu_type} nodes of one IB group and the largest "
                         f"group{where} has {max(fleet.group_free[g] for g in groups)} GPUs")


def why_over_quota(
    quotas: Quotas, org_id: int, project_id: int, gpu_type: str, gpu_count: int
) -> Never | None:
    """None when `gpu_count` is within the org's and the project's concurrent-GPU quotas on the type."""
    org_cap = quotas.org.get((org_id, gpu_type))
    if org_cap is not None and gpu_count > org_cap:
        return Never("size", f"the organization's concurrent-GPU quota on {gpu_type} is {org_cap}")
    project_cap = quotas.project.get((project_id, gpu_type))
    if project_cap is not None and gpu_count > project_cap:
        return Never("size", f"the project's concurrent-GPU quota on {gpu_type} is {project_cap}")
    return None
