"""An organization's fair-share tree as the scheduler sees it (Slurm's `sshare -l` for one org).

Reads the same inputs a pass reads (`adapter.snapshot.load_usage` / `load_shares`) and the core's
own `tree_levels` / `fair_tree_factors`, so the numbers cannot drift from the scheduler's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings

from accounts.models import Membership, Organization
from config.clock import db_now
from scheduling import core
from scheduling.adapter.snapshot import load_shares, load_usage, offered_queued
from scheduling.core.fairshare import Level, tree_levels
from scheduling.models import Job, JobState
from scheduling.services import dependencies

KEY = ("org_id", "project_id", "user_id")


def _ranked_associations(now: datetime) -> set[tuple[int, int, int]]:
    """The (org, project, user) a pass ranks: those with a job it is offered (`load_pending`'s
    filters: queued, not held, past its backoff, dependencies met) or a job placed or running."""
    offered = offered_queued(now)
    live = set(offered.filter(dependency="").values_list(*KEY).distinct().order_by())
    waiting = {job_id: key for job_id, *key in offered.exclude(dependency="").values_list("id", *KEY)}
    blocked = dependencies.unmet_among(list(waiting)) if waiting else set()
    live |= {tuple(key) for job_id, key in waiting.items() if job_id not in blocked}
    placed = Job.objects.filter(state__in=(JobState.SCHEDULED, JobState.RUNNING))
    return live | set(placed.values_list(*KEY).distinct().order_by())


def _level(level: Level, usage_seconds: float, weight: float) -> dict[str, Any]:
    fair = level.fair_share
    return {"weight": weight, "share": level.share, "usage": level.usage,
            "usage_gpu_hours": round(usage_seconds / 3600.0, 6),
            "level_fair_share": None if fair == float("inf") else fair}


def org_fair_share(org: Organization) -> dict[str, Any]:
    """The org among the orgs with work, its projects, and their members: each one's weight, its
    share and decayed usage among its siblings, the level fair share (share / usage) and, for users
    with queued or running jobs (the associations a pass ranks), the fair-share factor."""
    now = db_now()
    half_life = float(getattr(settings, "SCHEDULER_FAIRSHARE_HALF_LIFE_SECONDS",
                              core.Config().fairshare_half_life_seconds))
    usage, shares = load_usage(now, half_life), load_shares()
    live = _ranked_associations(now)
    members = {(org.pk, p, u) for p, u in Membership.objects.filter(project__org=org)
               .values_list("project_id", "user_id")}
    # Levels among the org's projects and members whether or not they run anything now; factors
    # only where a pass computes one, over exactly the associations it ranks.
    paths = tree_levels(live | members, usage, shares)
    factors = core.fair_tree_factors(live, usage, shares)
    mine = sorted(k for k in paths if k[0] == org.pk)
    names = dict(org.projects.values_list("id", "slug"))
    users = dict(Membership.objects.filter(project__org=org).values_list("user_id", "user__username"))
    projects: dict[int, dict[str, Any]] = {}
    for key in mine:
        _, project, user = key
        org_level, project_level, user_level = paths[key]
        entry = projects.setdefault(project, {
            "id": project, "slug": names.get(project, ""),
            **_level(project_level, usage.project.get(project, 0.0), shares.project.get(project, 1.0)),
            "users": [],
        })
        entry["users"].append({
            "id": user, "username": users.get(user, ""),
            **_level(user_level, usage.user.get((project, user), 0.0), shares.user.get((project, user), 1.0)),
            "fair_share_factor": factors.get(key),
        })
    org_level = paths[mine[0]][0] if mine else Level(0.0, 0.0)
    return {
        "org": org.pk, "computed_at": now, "half_life_seconds": half_life,
        **_level(org_level, usage.org.get(org.pk, 0.0), shares.org.get(org.pk, 1.0)),
        "projects": sorted(projects.values(), key=lambda p: p["slug"]),
    }
