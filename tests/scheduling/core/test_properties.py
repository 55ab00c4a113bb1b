"""Hypothesis: for random fleets and queues, no GPU is double-allocated, capacity is never exceeded,
ready-only placement, and every pending job gets exactly one Place or Skip with a reason."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core import Node, PendingJob, Quotas, Reservation, RunningJob, Snapshot, schedule
from scheduling.core.reasons import is_wait_reason
from tests.scheduling.core.helpers import TYPES, snap

CLASSES = ("production", "premium", "standard", "batch", "interactive")


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    n_nodes = draw(st.integers(1, 8))
    nodes: list[Node] = []
    now = 100_000.0
    for nid in range(n_nodes):
        gpus = draw(st.sampled_from((1, 2, 4, 8)))
        state = draw(st.sampled_from(("ready", "ready", "ready", "draining", "unknown", "down")))
        # A maintenance window ahead (or just begun) on some nodes.
        until = draw(st.sampled_from((None, None, None, now + 3600, now + 50_000, now - 10)))
        # When it ends (the adapter names it only for a node that only the window keeps out): a
        # draining node may be inside its window.
        ends = None
        if until is not None and state == "ready":
            ends = max(until, now) + draw(st.sampled_from((600.0, 20_000.0)))
        elif state == "draining":
            ends = draw(st.sampled_from((None, now + 1800, now + 30_000)))
        # Now and then a GPU the node reports busy with no known job on it (never offered, nor promised).
        phantom = draw(st.sampled_from((None, None, None, 0)))
        nodes.append(
            Node(
                nid,
                draw(st.sampled_from(sorted(TYPES))),
                gpus,
                frozenset(range(gpus)) - {phantom},
                region=draw(st.sampled_from(("eu", "us"))),
                nvlink_domain=f"nv{nid % 2}",
                ib_group=draw(st.sampled_from(("", "a", "b"))),
                state=state,
                available_until=until,
                maintenance_ends=ends,
            )
        )
    run: list[RunningJob] = []
    for k in range(draw(st.integers(0, 8))):
        n = draw(st.sampled_from(nodes))
        free = sorted(
            set(range(n.gpu_count)) - {i for r in run for m, idx in r.allocations if m == n.id for i in idx}
        )
        if not free:
            continue
        take = tuple(free[: draw(st.integers(1, len(free)))])
        run.append(
            RunningJob(
                id=1000 + k,
                attempt_id=1000 + k,
                org_id=draw(st.integers(1, 3)),
                project_id=draw(st.integers(1, 3)),
                user_id=draw(st.integers(1, 3)),
                priority_class=draw(st.sampled_from(CLASSES)),
                preemptible=draw(st.booleans()),
                gpu_type=n.gpu_type,
                allocations=((n.id, take),),
                started_at=now - draw(st.floats(0, 50_000)),
                max_wall_seconds=draw(st.floats(60, 100_000)),
                preemption_requested_at=draw(st.sampled_from((None, None, now - 30))),
                times_preempted=draw(st.integers(0, 4)),
            )
        )
    pending = [
        PendingJob(
            id=k,
            org_id=draw(st.integers(1, 3)),
            project_id=draw(st.integers(1, 3)),
            user_id=draw(st.integers(1, 3)),
            priority_class=draw(st.sampled_from(CLASSES)),
            gpu_count=draw(st.sampled_from((1, 1, 2, 3, 4, 8, 12, 16))),
            max_wall_seconds=draw(st.floats(60, 100_000)),
            submitted_at=now - draw(st.floats(0, 100_000)),
            gpu_types=tuple(draw(st.lists(st.sampled_from(sorted(TYPES)), max_size=3, unique=True))),
            gpu_memory_gb=draw(st.sampled_from((0, 0, 24, 80))),
            regions=tuple(draw(st.lists(st.sampled_from(("eu", "us")), max_size=1))),
            budget_ok=draw(st.booleans()) or draw(st.booleans()),
            max_price=draw(st.sampled_from((None, None, None, 400_000, 2_000_000))),
        )
        for k in range(draw(st.integers(0, 25)))
    ]
    policy = draw(st.sampled_from(("fair", "fair", "fifo", "fifo_backfill")))
    caps = st.dictionaries(st.tuples(st.integers(1, 3), st.sampled_from(sorted(TYPES))), st.integers(1, 16))
    quotas = Quotas(org=draw(caps), project=draw(caps)) if draw(st.booleans()) else None
    return snap(
        nodes, pending, run, now=now, policy=policy, quotas=quotas,
        min_runtime_before_preemption_seconds=draw(st.sampled_from((0.0, 0.0, 600.0))),
        preemption_exempt_growth=draw(st.sampled_from((1.0, 2.0, 4.0))),
        preemption_exempt_after=draw(st.sampled_from((0, 1, 3))),
    )


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_no_double_allocation_capacity_and_one_decision_per_job(s: Snapshot) -> None:
    res = schedule(s)
    nodes = {n.id: n for n in s.nodes}
    used: set[tuple[int, int]] = {(n, i) for r in s.running for n, idx in r.allocations for i in idx}
    for p in res.placements:
        job = next(j for j in s.pending if j.id == p.job_id)
        assert sum(len(idx) for _, idx in p.allocations) == job.gpu_count  # whole gang or nothing
        groups = set()
        for nid, idx in p.allocations:
            n = nodes[nid]
            assert n.state == "ready" and n.gpu_type == p.gpu_type
            assert TYPES[n.gpu_type].memory_gb >= job.gpu_memory_gb
            # A job whose top-up was refused goes only where its hold covers the price.
            assert job.max_price is None or TYPES[n.gpu_type].price_per_gpu_hour_micro <= job.max_price
            assert not job.regions or n.region in job.regions
            assert all(0 <= i < n.gpu_count for i in idx)
            # Nothing runs into a node's maintenance window (by its max wall).
            assert n.available_until is None or s.now + p.max_wall_seconds <= n.available_until
            for i in idx:
                assert (nid, i) not in used, "GPU double-allocated"
                used.add((nid, i))
            groups.add(n.ib_group or f"node:{nid}")
        assert len(groups) == 1  # one node, or one IB group
    for nid, n in nodes.items():
        assert sum(1 for m, _ in used if m == nid) <= n.gpu_count
    # Nor does a reservation (EASY or preemption) promise GPUs a window takes before the job ends
    # (GPUs of a node from the end of its window are free of it).
    for r in res.reservations:
        wall = next(j for j in s.pending if j.id == r.job_id).max_wall_seconds
        for nid, _ in r.allocations:
            n = nodes[nid]
            until, ends = n.available_until, n.maintenance_ends
            assert until is None or r.start_at + wall <= until or (ends is not None and r.start_at >= ends)
    # No EASY reservation is delayed by this pass: each GPU it names is free by its start (of the
    # job running there, by its wall or its grace; of a job placed in this pass, by its max wall),
    # and a node that is not ready, or is held out for its window, is back by then.
    holder = {(n, i): run for run in s.running for n, idx in run.allocations for i in idx}
    placed = {(n, i): s.now + p.max_wall_seconds
              for p in res.placements for n, idx in p.allocations for i in idx}
    for r in res.reservations:
        if r.kind != "backfill":
            continue
        for nid, idx in r.allocations:
            n = nodes[nid]
            if n.state != "ready" or (n.available_until is not None and n.available_until < r.start_at):
                assert n.maintenance_ends is not None and r.start_at >= n.maintenance_ends, (r, n)
            for i in idx:
                assert placed.get((nid, i), s.now) <= r.start_at, f"job {r.job_id}'s reservation delayed"
                run = holder.get((nid, i))
                assert run is None or _exit(run, s, set()) <= r.start_at, (r, run)
                # A GPU the node reports busy with no known job on it is never promised.
                assert run is not None or i in n.free_gpu_indices, (r, n)
    # One EASY reservation per type, at most max_reservations of them; one on GPUs back from
    # maintenance only takes neither, and no GPU back from maintenance is promised to two jobs.
    easy = [r for r in res.reservations if r.kind == "backfill" and not r.returning]
    assert len({r.gpu_type for r in easy}) == len(easy) <= s.config.max_reservations
    assert res.reservation == (easy[0] if easy else None)
    back: set[tuple[int, int]] = set()
    for r in res.reservations:
        if r.kind != "backfill":
            continue
        held_out = {nid for nid, _ in r.allocations
                    if nodes[nid].state != "ready" or (nodes[nid].available_until is not None
                                                      and nodes[nid].available_until < r.start_at)}
        assert r.returning == (held_out == {nid for nid, _ in r.allocations}), r
        for nid, idx in r.allocations:
            if nid in held_out:
                assert not back & {(nid, i) for i in idx}, f"GPUs of node {nid} promised twice"
                back.update((nid, i) for i in idx)
    # Every pending job exactly once, with a Place or a Skip carrying a known reason.
    decided = [d.job_id for d in res.decisions if not hasattr(d, "for_job_id")]
    assert sorted(decided) == sorted(j.id for j in s.pending)
    for sk in res.skips:
        assert is_wait_reason(sk.reason_code) and res.wait_reasons[sk.job_id] == sk.reason_code
    # Preemption only of preemptible, strictly lower-class jobs, each at most once.
    rank = {c.name: c.rank for c in s.config.priority_classes}
    victims = [p.job_id for p in res.preemptions]
    assert len(victims) == len(set(victims))
    for p in res.preemptions:
        v = next(r for r in s.running if r.id == p.job_id)
        j = next(x for x in s.pending if x.id == p.for_job_id)
        assert v.preemptible and v.preemption_requested_at is None
        # Ran at least its exemption, grown by its earlier preemptions. Few generated snapshots
        # preempt at all (~1.4 %); test_preemption.py pins the rule itself.
        cfg = s.config
        grown = max(0, v.times_preempted - cfg.preemption_exempt_after)
        exempt = cfg.min_runtime_before_preemption_seconds * cfg.preemption_exempt_growth**grown
        assert s.now - v.started_at >= exempt
        assert rank[v.priority_class] < rank[j.priority_class]
        assert v.priority_class != "production"


def _exit(r: RunningJob, s: Snapshot, signalled_now: set[int]) -> float:
    """When a running job frees its GPUs: at its max wall, or at the end of its grace once signalled."""
    end = r.started_at + r.max_wall_seconds
    signalled = s.now if r.id in signalled_now else r.preemption_requested_at
    if signalled is not None:
        end = min(end, signalled + s.config.grace_seconds)
    return max(s.now, end)


@st.composite
def crowded_quotas(draw: st.DrawFn) -> Snapshot:
    """Few tenants on one GPU type, tight quotas, mixed sizes and walls: the later jobs of a
    scope often fit under the quota that an earlier one waits for."""
    now = 100_000.0
    walls = st.sampled_from((60.0, 600.0, 1_800.0, 3_600.0, 7_200.0, 20_000.0))  # few: ends and starts meet
    nodes = [
        Node(n, "H100", 8, frozenset(range(8)), region=draw(st.sampled_from(("r1", "r2"))))
        for n in range(draw(st.integers(1, 4)))
    ]
    run: list[RunningJob] = []
    for k, n in enumerate(nodes):
        cut = draw(st.integers(0, 8))
        for lo, hi in ((0, cut), (cut, 8)) if draw(st.booleans()) else ((0, cut),):
            if hi > lo:
                run.append(
                    RunningJob(
                        id=1000 + 2 * k + lo,
                        attempt_id=1000 + 2 * k + lo,
                        org_id=draw(st.sampled_from((1, 1, 2))),
                        project_id=draw(st.integers(1, 2)),
                        user_id=1,
                        priority_class=draw(st.sampled_from(CLASSES)),
                        preemptible=draw(st.booleans()),
                        gpu_type="H100",
                        allocations=((n.id, tuple(range(lo, hi))),),
                        started_at=now - draw(st.sampled_from((0.0, 300.0, 900.0))),
                        max_wall_seconds=draw(walls),
                    )
                )
    pending = [
        PendingJob(
            id=k, org_id=draw(st.sampled_from((1, 1, 1, 2))), project_id=draw(st.integers(1, 2)), user_id=1,
            priority_class=draw(st.sampled_from(CLASSES)),
            gpu_count=draw(st.sampled_from((1, 2, 4, 4, 8, 12))),
            max_wall_seconds=draw(walls), submitted_at=now - draw(st.floats(0, 10_000)),
            regions=draw(st.sampled_from(((), (), ("r1",), ("r2",)))),
        )
        for k in range(draw(st.integers(2, 12)))
    ]
    caps = st.dictionaries(st.tuples(st.integers(1, 2), st.just("H100")), st.integers(2, 12), min_size=1)
    return snap(
        nodes, pending, run, now=now, quotas=Quotas(org=draw(caps), project=draw(st.none() | caps) or {}),
        policy=draw(st.sampled_from(("fair", "fifo_backfill"))),
        min_runtime_before_preemption_seconds=draw(st.sampled_from((0.0, 600.0))),
        preemption_min_gain=draw(st.sampled_from((0.0, 1.0))),
    )


@settings(max_examples=300, deadline=None)
@given(snapshots() | crowded_quotas())
def test_quotas_hold_and_no_later_job_takes_the_quota_promised_to_a_waiting_job(s: Snapshot) -> None:
    """Placements never take an org or a project over its quota (counting what already runs over
    it), and every reserved job (EASY, preemption or quota reservation) still fits under its quotas
    at its start, given the jobs that will still run then and the other reservations under way
    then: no job placed in the pass delays it, and no two promises of quota room overlap."""
    res = schedule(s)
    pending = {j.id: j for j in s.pending}
    signalled_now = {p.job_id for p in res.preemptions}
    # (level, id, type) -> [(exit time, GPUs)] of what runs now and what this pass starts.
    runs: dict[tuple[str, int, str], list[tuple[float, int]]] = {}
    for r in s.running:
        for key in (("org", r.org_id, r.gpu_type), ("project", r.project_id, r.gpu_type)):
            runs.setdefault(key, []).append((_exit(r, s, signalled_now), r.gpu_count))
    before = {k: sum(g for _, g in v) for k, v in runs.items()}
    for p in res.placements:
        j = pending[p.job_id]
        for key in (("org", j.org_id, p.gpu_type), ("project", j.project_id, p.gpu_type)):
            runs.setdefault(key, []).append((s.now + p.max_wall_seconds, j.gpu_count))
    caps = {("org", o, t): c for (o, t), c in s.quotas.org.items()}
    caps.update({("project", p, t): c for (p, t), c in s.quotas.project.items()})
    for key, cap in caps.items():
        now_used = sum(g for _, g in runs.get(key, ()))
        assert now_used <= max(cap, before.get(key, 0)), f"{key} over its quota"
    # Each reservation's job fits at its start beside what still runs then and beside the other
    # reservations of its scope that have started by then and not reached their wall.
    def scopes(r: Reservation) -> list[tuple[str, int, str]]:
        j = pending[r.job_id]
        keys = (("org", j.org_id, r.gpu_type), ("project", j.project_id, r.gpu_type))
        return [k for k in keys if k in caps]

    for r in res.reservations:
        for key in scopes(r):
            still = sum(g for end, g in runs.get(key, ()) if end > r.start_at)
            beside = sum(
                pending[o.job_id].gpu_count for o in res.reservations
                if o is not r and key in scopes(o)
                and o.start_at <= r.start_at < o.start_at + pending[o.job_id].wall_on(o.gpu_type)
            )
            assert still + beside + pending[r.job_id].gpu_count <= caps[key], (
                f"job {r.job_id}'s {r.kind} reservation delayed on {key}"
            )
