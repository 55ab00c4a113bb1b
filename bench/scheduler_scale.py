"""One full scheduler tick with the database: 10,000 pending jobs on 1,000 nodes (8,000 GPUs, 3 types).

Run: DJANGO_SETTINGS_MODULE=config.settings.test python bench/scheduler_scale.py [--repeat 3]
Creates a throwaway PostgreSQL database (`bench_scheduler`), fills it from the core bench's
`build_snapshot()` (same fleet, running jobs and queue), then times, in one run:
  baseline  a plain SELECT of the pending jobs (the floor for any pass),
  load      the adapter's snapshot load,
  core      `schedule()` on the loaded snapshot,
  tick      the full `run_scheduling_pass()` (leader lock + load + core + write + audit), rolled
            back after each repetition so every repetition sees the same queue (first pass: every
            pending job's wait reason changes and is audited),
  steady    a second pass right after it in the same (rolled back) transaction: only what
            changed since the first pass is written and audited,
  view      the queue ordering behind GET /jobs/{id}/priority (`order_queue()`: load +
            `queue_order` + writing one cache entry per job), as on a cache miss, and one job's
            standing read from that cache (what a GET costs in between).
Prints each time and its ratio to the baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
os.environ.setdefault("TEST_DB_NAME", "bench_scheduler")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.test.utils import setup_databases, teardown_databases  # noqa: E402

from accounts.models import Organization, Project, Region  # noqa: E402
from bench.scheduler_scale_core import GPU_TYPES, build_snapshot  # noqa: E402
from ledger.models import Hold  # noqa: E402
from metering.models import AttemptUsage  # noqa: E402
from scheduling import core  # noqa: E402
from scheduling.adapter.snapshot import load_snapshot  # noqa: E402
from scheduling.models import (  # noqa: E402
    Allocation,
    AttemptState,
    GpuPrice,
    GpuType,
    Job,
    JobAttempt,
    JobState,
    Node,
    PriorityClass,
    PriorityGrant,
)
from scheduling.selectors import job_standing, order_queue  # noqa: E402
from scheduling.services.tick import run_scheduling_pass  # noqa: E402


class Rollback(Exception):
    pass


def populate(snap: core.Snapshot) -> None:
    """Write the synthetic snapshot to the database with bulk inserts."""
    now = datetime.fromtimestamp(snap.now, UTC)
    at = lambda seconds: datetime.fromtimestamp(seconds, UTC)  # noqa: E731
    region = Region.objects.create(code="bench", name="Bench")
    types = {name: GpuType.objects.create(name=name, memory_gb=t.memory_gb) for name, t in GPU_TYPES.items()}
    GpuPrice.objects.bulk_create(
        GpuPrice(
            gpu_type=types[n],
            price_per_gpu_hour=t.price_per_gpu_hour_micro,
            effective_from=now - timedelta(days=365),
        )
        for n, t in GPU_TYPES.items()
    )
    classes = {c.name: c for c in PriorityClass.objects.all()}
    org_ids = sorted({j.org_id for j in snap.pending} | {r.org_id for r in snap.running})
    orgs = {o: Organization(name=f"org {o}", slug=f"bench-org-{o}") for o in org_ids}
    Organization.objects.bulk_create(orgs.values())
    # Every org may use every restricted class (production): the synthetic queue's classes are the
    # core bench's (an ungranted org's jobs would wait out of the pass, session 16).
    PriorityGrant.objects.bulk_create(
        PriorityGrant(org=org, priority_class=klass) for org in orgs.values() for klass in classes.values()
        if klass.restricted
    )
    project_ids = sorted({j.project_id for j in snap.pending} | {r.project_id for r in snap.running})
    projects = {p: Project(org=orgs[p // 10], name=f"p{p}", slug=f"p{p}") for p in project_ids}
    Project.objects.bulk_create(projects.values())
    user_ids = sorted({j.user_id for j in snap.pending} | {r.user_id for r in snap.running})
    User = get_user_model()
    users = {u: User(username=f"bench-user-{u}") for u in user_ids}
    User.objects.bulk_create(users.values())
    node_objs = {
        n.id: Node(
            name=f"node-{n.id}",
            region=region,
            gpu_type=types[n.gpu_type],
            gpu_count=n.gpu_count,
            nvlink_domain=n.nvlink_domain,
            ib_group=n.ib_group,
            state=n.state,
            last_heartbeat_at=now,
        )
        for n in snap.nodes
    }
    Node.objects.bulk_create(node_objs.values(), batch_size=2000)
    jobs: list[tuple[core.PendingJob | core.RunningJob, Job]] = []
    holds: list[Hold] = []
    for item in (*snap.running, *snap.pending):
        holds.append(
            Hold(
                org=orgs[item.org_id],
                project=projects[item.project_id],
                user=users[item.user_id],
                key=f"bench-{type(item).__name__}-{item.id}",
                authorized=10**12,
                created_at=now,
            )
        )
    Hold.objects.bulk_create(holds, batch_size=5000)
    for item, hold in zip((*snap.running, *snap.pending), holds, strict=True):
        running = isinstance(item, core.RunningJob)
        jobs.append(
            (
                item,
                Job(
                    org=orgs[item.org_id],
                    project=projects[item.project_id],
                    user=users[item.user_id],
                    name=f"bench-{item.id}",
                    gpu_types=[item.gpu_type] if running else list(item.gpu_types),
                    gpu_count=item.gpu_count,
                    gpu_memory_gb=0 if running else item.gpu_memory_gb,
                    max_wall_seconds=int(item.max_wall_seconds),
                    priority_class=classes[item.priority_class],
                    preemptible=item.preemptible,
                    state=JobState.RUNNING if running else JobState.QUEUED,
                    current_hold=hold,
                    submitted_at=at(item.started_at if running else item.submitted_at),
                    attempt_count=1 if running else 0,
                ),
            )
        )
    Job.objects.bulk_create([j for _, j in jobs], batch_size=5000)
    attempts: list[tuple[core.RunningJob, JobAttempt]] = []
    for item, job in jobs:
        if isinstance(item, core.RunningJob):
            started = at(item.started_at)
            attempts.append(
                (
                    item,
                    JobAttempt(
                        job=job,
                        number=1,
                        org_id=job.org_id,
                        state=AttemptState.RUNNING,
                        gpu_type=types[item.gpu_type],
                        gpu_count=item.gpu_count,
                        rate_per_gpu_hour=GPU_TYPES[item.gpu_type].price_per_gpu_hour_micro,
                        hold=job.current_hold,
                        scheduled_at=started,
                        started_at=started,
                    ),
                )
            )
    JobAttempt.objects.bulk_create([a for _, a in attempts], batch_size=5000)
    Allocation.objects.bulk_create(
        (
            Allocation(attempt=a, node=node_objs[n], gpu_index=i, allocated_at=a.scheduled_at)
            for item, a in attempts
            for n, idx in item.allocations
            for i in idx
        ),
        batch_size=5000,
    )
    AttemptUsage.objects.bulk_create(
        (
            AttemptUsage(
                attempt=a,
                org_id=a.org_id,
                reported_gpu_ms=int((now - a.started_at).total_seconds()) * 1000 * a.gpu_count,
                billable_gpu_ms=int((now - a.started_at).total_seconds()) * 1000 * a.gpu_count,
            )
            for _, a in attempts
        ),
        batch_size=5000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")


def timed(fn: object) -> float:
    t0 = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=1_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    # The synthetic snapshot's clock is "now" so that ages and aging are realistic.
    snap = build_snapshot(pending=args.pending, nodes=args.nodes, now=time.time())
    settings.SCHEDULER_QUEUE_VIEW_SECONDS = 5.0  # the production default (the test settings turn it off)
    old = setup_databases(verbosity=0, interactive=False)
    try:
        t_fill = timed(lambda: populate(snap))
        pending_rows = Job.objects.filter(state=JobState.QUEUED).values_list(
            "id", "org_id", "project_id", "user_id", "gpu_count", "submitted_at"
        )
        base = min(timed(lambda: list(pending_rows.all())) for _ in range(args.repeat))
        loads, cores, ticks, steadies, rows, steady_rows, views, reads = [], [], [], [], [], [], [], []
        for _ in range(args.repeat):
            with transaction.atomic():
                now = datetime.now(UTC)
                t0 = time.perf_counter()
                loaded = load_snapshot(now=now)
                loads.append(time.perf_counter() - t0)
                cores.append(timed(lambda ld=loaded: core.schedule(ld.snapshot)))
                views.append(timed(order_queue))
                someone = Job.objects.filter(state=JobState.QUEUED).order_by("-id").first()
                reads.append(timed(lambda j=someone: job_standing(j)))
            try:
                with transaction.atomic():
                    t0 = time.perf_counter()
                    rows.append(run_scheduling_pass(trigger="bench"))
                    ticks.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    steady_rows.append(run_scheduling_pass(trigger="bench-steady"))
                    steadies.append(time.perf_counter() - t0)
                    raise Rollback
            except Rollback:
                pass
        row, steady = rows[-1], steady_rows[-1]
        gpus = sum(n.gpu_count for n in snap.nodes)
        print(
            f"fleet: {len(snap.nodes)} nodes, {gpus} GPUs of {len(GPU_TYPES)} types, "
            f"{len(snap.running)} running attempts, {len(snap.pending)} pending jobs "
            f"(filled in {t_fill:.1f} s)"
        )
        print(f"baseline SELECT of pending jobs : {base * 1000:8.1f} ms   1.0x")
        for name, values in (("snapshot load", loads), ("core schedule()", cores), ("full tick", ticks),
                             ("steady-state tick (2nd pass)", steadies),
                             ("queue ordering (priority, miss)", views),
                             ("one job's standing (cached)", reads)):
            best = min(values)
            print(f"{name:<32}: {best * 1000:8.1f} ms {best / base:6.1f}x   (best of {args.repeat})")
        if row is not None:
            print(
                f"last tick: placed={row.placed} backfilled={row.backfilled} preempted={row.preempted} "
                f"wait-reasons changed={row.waiting_changed} conflicts={row.conflicts} | "
                f"load={row.load_ms} ms core={row.core_ms} ms write={row.write_ms} ms "
                f"total={row.total_ms} ms"
            )
        if steady is not None:
            print(
                f"last steady tick: placed={steady.placed} preempted={steady.preempted} "
                f"wait-reasons changed={steady.waiting_changed} | load={steady.load_ms} ms "
                f"core={steady.core_ms} ms write={steady.write_ms} ms total={steady.total_ms} ms"
            )
    finally:
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()
