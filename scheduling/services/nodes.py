"""Nodes as the agent sees them: bearer tokens, authentication, registration, liveness.

Token format `gpun_<prefix>_<secret>` (like API keys, accounts/keys.py): the prefix finds the row
(unique index), only the SHA-256 of the whole token is stored, and a fresh token replaces the old
one at once (rotation = issue again).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from audit.models import AuditEvent
from audit.services import record
from config.clock import db_now
from config.errors import DomainError
from scheduling.models import Allocation, AttemptState, GpuType, JobAttempt, Node, NodeCordon, NodeState

TOKEN_PREFIX = "gpun"  # noqa: S105 - a format marker, not a secret


class NodeRegistrationRejected(DomainError):
    """The agent's inventory contradicts the node's configuration."""

    type = "node-registration-rejected"
    status = 409
    title = "Registration rejected"


def hash_token(raw: str) -> str:
    # Tokens carry 256 random bits: a fast hash suffices (no dictionary attack is possible).
    return hashlib.sha256(raw.encode()).hexdigest()


def parse_token_prefix(raw: str) -> str | None:
    parts = raw.split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1]


@transaction.atomic
def issue_node_token(*, node: Node, actor: Any = None) -> str:
    """Give the node a new bearer token (the old one stops working); returns the raw token once."""
    prefix = secrets.token_hex(6)
    raw = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    Node.objects.filter(pk=node.pk).update(token_prefix=prefix, token_hash=hash_token(raw))
    node.token_prefix, node.token_hash = prefix, hash_token(raw)
    record(
        action="node.token_issued",
        subject_type="node",
        subject_id=node.pk,
        actor_type=AuditEvent.ActorType.USER if actor is not None else AuditEvent.ActorType.SYSTEM,
        actor_id=str(getattr(actor, "pk", "") or ""),
        data={"prefix": prefix},
    )
    return raw


def authenticate_node(raw: str) -> Node | None:
    """The node a bearer token belongs to, or None (constant-time hash comparison)."""
    prefix = parse_token_prefix(raw.strip())
    if prefix is None:
        return None
    node = Node.objects.filter(token_prefix=prefix).first()
    if node is None or not node.token_hash:
        return None
    if not hmac.compare_digest(node.token_hash, hash_token(raw.strip())):
        return None
    return node


@dataclass(frozen=True)
class Registration:
    """What the agent learns when it registers."""

    node_id: int
    heartbeat_interval_s: int
    running_attempts: list[int]


def _check_inventory(node: Node, gpus: list[dict[str, Any]]) -> int:
    """Validate the reported GPUs against the node; returns the GPU count to keep."""
    if not gpus:
        raise NodeRegistrationRejected("The agent reported no GPUs.")
    models = {str(g.get("model", "")).upper() for g in gpus}
    gpu_type = GpuType.objects.get(pk=node.gpu_type_id)
    if models != {gpu_type.name.upper()}:
        # Pricing is per type: a node whose GPUs differ from its configured type must not run jobs.
        raise NodeRegistrationRejected(
            f"Node {node.name} is configured as {gpu_type.name} but reports {sorted(models)}.",
            configured=gpu_type.name,
            reported=sorted(models),
        )
    indices = sorted(int(g["index"]) for g in gpus)
    if indices != list(range(len(indices))):
        raise NodeRegistrationRejected(f"GPU indices must be 0..n-1, got {indices}.")
    busy = Allocation.objects.filter(node=node, released_at__isnull=True, gpu_index__gte=len(indices))
    if busy.exists():
        raise NodeRegistrationRejected(
            f"Node {node.name} reports {len(indices)} GPUs but higher indices are allocated."
        )
    return len(indices)


@transaction.atomic
def register_node(
    *,
    node: Node,
    gpus: list[dict[str, Any]],
    labels: dict[str, Any] | None = None,
    agent_version: str = "",
    heartbeat_interval_s: int = 30,
) -> Registration:
    """(Re)register the node's agent: check its inventory, mark it live, list what runs there.

    A fresh agent runs nothing, so the attempts listed as running are the ones it will report lost.
    Attempts whose part here has not started (scheduled ones, or a gang running on its other nodes)
    are not listed: the agent gets them from /assignments.
    """
    node = Node.objects.select_for_update().get(pk=node.pk)
    count = _check_inventory(node, gpus)
    labels = labels or {}
    now = db_now()
    fields: dict[str, Any] = {
        "gpu_count": count,
        "agent_version": str(agent_version)[:32],
        "registered_at": now,
        "last_heartbeat_at": now,
        # Health only: an operator's drain or out-of-service cordon is another column and stays.
        "state": NodeState.READY,
    }
    for name in ("nvlink_domain", "ib_group"):
        if labels.get(name):
            fields[name] = str(labels[name])[:64]
    Node.objects.filter(pk=node.pk).update(**fields)
    running = sorted(
        set(
            JobAttempt.objects.filter(
                state__in=(AttemptState.RUNNING, AttemptState.STOPPING),
                allocations__node=node,
                allocations__released_at__isnull=True,
                allocations__started_at__isnull=False,
            ).values_list("pk", flat=True)
        )
    )
    record(
        action="node.registered",
        subject_type="node",
        subject_id=node.pk,
        actor_type=AuditEvent.ActorType.AGENT,
        actor_id=str(node.pk),
        data={
            "gpus": count,
            "previous_state": node.state,
            "cordon": node.cordon,
            "agent_version": fields["agent_version"],
            "running_attempts": running,
        },
    )
    return Registration(node_id=node.pk, heartbeat_interval_s=heartbeat_interval_s, running_attempts=running)


def mark_node_alive(*, node_id: int) -> bool:
    """A silent node (`unknown` or `down`) heard from again is `ready`: one audited move
    (`sched.node.state`, `heartbeat-resumed`), the counterpart of the sweep's. Of concurrent
    heartbeats only one moves it. Returns whether this call did."""
    with transaction.atomic():
        node = (Node.objects.select_for_update(no_key=True)  # a pass's FOR KEY SHARE does not block it
                .filter(pk=node_id, state__in=(NodeState.UNKNOWN, NodeState.DOWN)).first())
        if node is None:
            return False
        Node.objects.filter(pk=node_id).update(state=NodeState.READY, last_heartbeat_at=db_now())
        record(action="sched.node.state", subject_type="node", subject_id=node_id,
               actor_type=AuditEvent.ActorType.AGENT, actor_id=str(node_id), reason_code="heartbeat-resumed",
               data={"from": node.state, "to": NodeState.READY, "cordon": node.cordon})
    return True


@transaction.atomic
def set_cordon(*, node: Node, cordon: str, actor: Any = None, why: str = "") -> Node:
    """An operator drains a node, takes it out of service, or returns it to service (audited).

    Heartbeats never touch it (they keep `state`, the node's health). Out of service: the node's
    live attempts are asked to stop with the preemption grace once this commits and are requeued
    elsewhere (`tick.evict_from_nodes_out_of_service`, also run by the node sweep)."""
    if cordon not in NodeCordon.values:
        raise ValueError(f"unknown cordon {cordon!r}")
    locked = Node.objects.select_for_update().get(pk=node.pk)
    if locked.cordon == cordon:
        return locked
    Node.objects.filter(pk=node.pk).update(cordon=cordon)
    record(
        action="sched.node.cordon", subject_type="node", subject_id=node.pk,
        actor_type=AuditEvent.ActorType.USER if actor is not None else AuditEvent.ActorType.SYSTEM,
        actor_id=str(getattr(actor, "pk", "")), reason_code=cordon or "in-service",
        data={"from": locked.cordon, "to": cordon, "state": locked.state, **({"why": why} if why else {})},
    )
    locked.cordon = cordon

    def after() -> None:
        from scheduling.services.tick import evict_from_nodes_out_of_service
        from scheduling.tasks import schedule_soon

        if cordon == NodeCordon.DOWN:
            evict_from_nodes_out_of_service(node_ids=[node.pk])
        schedule_soon(trigger="cordon")

    transaction.on_commit(after, robust=True)
    return locked
