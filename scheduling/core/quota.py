"""Concurrent-GPU quotas within one pass: what each org and project uses per GPU type, and the
quota room promised to jobs that wait (the quota side of EASY backfill).

A job held back by its quota used to wait while later, lower-priority jobs of the same org or
project that fit under the quota took every GPU the quota freed: it could be overtaken for ever.
Now the first job a quota holds back on a scope (org or project, per GPU type) gets a *quota
reservation*: the room it needs, from the time enough of the scope's running jobs reach their max
wall. Every job that waits with GPUs reserved (EASY or preemption) claims its quota room the same
way. A later job of the scope may use the quota only if, at the start of every claim before its
end, what still runs then plus the claims begun by then plus itself fit the quota: a claim is never
delayed by a job behind it. Claims are counted as lasting for ever (their jobs' runs are not
known), so a check can be strict, never lax.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from scheduling.core.model import PendingJob, Quotas, RunningJob

Level = Literal["org", "project"]
Scope = tuple[Level, int, str]  # (level, org or project id, GPU type)


@dataclass(frozen=True, slots=True)
class Claim:
    """`gpus` of a scope's quota promised to `job_id` from `start_at`, by a reservation of `kind`;
    `held_back`: the scope's quota held the job back when it was made (its turn on that scope)."""

    job_id: int
    start_at: float
    gpus: int
    kind: str
    held_back: bool = False


@dataclass(frozen=True, slots=True)
class QuotaBlock:
    """Why a job cannot use its quota on `gpu_type` now: the `level`'s quota itself (`holder` None),
    or the room promised to the waiting job `holder`."""

    gpu_type: str
    level: Level
    holder: int | None = None


class QuotaBook:
    def __init__(
        self, quotas: Quotas, running: Sequence[RunningJob], now: float, grace_seconds: float
    ) -> None:
        self.quotas = quotas
        self.active = bool(quotas.org or quotas.project)
        self.now = now
        self._grace = grace_seconds
        self._running = running
        self.used: dict[Scope, int] = defaultdict(int)
        self.signalled: dict[Scope, list[RunningJob]] = defaultdict(list)  # before this pass
        for r in running:
            for scope in _scopes(r.org_id, r.project_id, r.gpu_type):
                self.used[scope] += r.gpu_count
                if r.preemption_requested_at is not None:
                    self.signalled[scope].append(r)
        self.claims: dict[Scope, list[Claim]] = defaultdict(list)
        self._exits: dict[int, float] = {}  # running job id -> exit time, once signalled in this pass
        self._placed: dict[Scope, list[tuple[float, int]]] = defaultdict(list)
        self._by_scope: dict[Scope, list[RunningJob]] | None = None  # built when first needed
        self._index: dict[Scope, tuple[list[float], list[int]]] = {}  # sorted exits, suffix sums

    # -- reading ----------------------------------------------------------------------------------
    def capped(self, job: PendingJob, gpu_type: str) -> Iterator[tuple[Scope, int]]:
        """The job's scopes with a quota on the type, with that quota: the org's first."""
        cap = self.quotas.org.get((job.org_id, gpu_type))
        if cap is not None:
            yield ("org", job.org_id, gpu_type), cap
        cap = self.quotas.project.get((job.project_id, gpu_type))
        if cap is not None:
            yield ("project", job.project_id, gpu_type), cap

    def has_claims(self, job: PendingJob, gpu_type: str) -> bool:
        return any(self.claims.get(scope) for scope, _cap in self.capped(job, gpu_type))

    def block(
        self, job: PendingJob, gpu_type: str, end: float, start: float | None = None, own_claims: bool = True
    ) -> QuotaBlock | None:
        """None when the job, running from `start` (default: now) until `end`, fits under its
        quotas on the type at its start and at the start of every claim before `end` (beside what
        still runs then and the claims begun by then). From now, a quota the job is over itself
        is named before any claim; from a later start (a reservation's), what runs now and ends
        by then does not count. `own_claims=False`: the job's own claims (a reservation it made
        earlier in the pass) do not count against it."""
        capped = list(self.capped(job, gpu_type))
        g = job.gpu_count
        if start is None:
            for scope, cap in capped:
                if self.used[scope] + g > cap:
                    return QuotaBlock(gpu_type, scope[0])
        for scope, cap in capped:
            overlapping = sorted((c for c in self.claims.get(scope, ())
                                  if c.start_at < end and (own_claims or c.job_id != job.id)), key=_start)
            if not overlapping:
                continue
            if start is None and self.used[scope] + g + sum(c.gpus for c in overlapping) <= cap:
                continue  # fits even if nothing running ends first
            t0, claimed = self.now if start is None else start, 0
            for c in overlapping:
                claimed += c.gpus
                if self.in_use_after(scope, max(c.start_at, t0)) + claimed + g > cap:
                    return QuotaBlock(gpu_type, scope[0], c.job_id)
        return None

    def reservable(self, job: PendingJob, gpu_type: str, end: float) -> bool:
        """Whether the job may get a quota reservation on the type: no job held back by the same
        scope has one yet (one per scope and type, as EASY makes one per type; an EASY or
        preemption claim there, or the claim of a job held back by its other level, does not
        take its turn). Its start then counts every claim."""
        for scope, cap in self.capped(job, gpu_type):
            claims = self.claims.get(scope, ())
            if self._held_back(scope, cap, job.gpu_count, end) and any(
                c.kind == "quota" and c.held_back for c in claims
            ):
                return False
        return True

    def _held_back(self, scope: Scope, cap: int, gpus: int, end: float) -> bool:
        overlapping = sum(c.gpus for c in self.claims.get(scope, ()) if c.start_at < end)
        return self.used[scope] + gpus + overlapping > cap

    def earliest_start(self, job: PendingJob, gpu_type: str) -> float | None:
        """When the job's gang first fits under its quotas on the type, as the scopes' jobs reach
        their max wall (existing claims held for ever); None if it never would."""
        start, g = self.now, job.gpu_count
        for scope, cap in self.capped(job, gpu_type):
            claimed = sum(c.gpus for c in self.claims.get(scope, ()))
            if g + claimed > cap:
                return None
            if self.used[scope] + g + claimed <= cap:
                continue
            exits, after = self.index(scope)
            # The first exit after which what still runs leaves room: after[i + 1] runs past exits[i].
            i = next(i for i in range(len(exits)) if after[i + 1] + g + claimed <= cap)
            start = max(start, exits[i])
        return start

    def deficits(
        self,
        job: PendingJob,
        gpu_type: str,
        start: float,
        end: float,
        victim: Callable[[RunningJob], bool],
    ) -> tuple[int, int]:
        """GPUs that must stop, at the (org, project) level, for the job to run from `start` (when
        its victims would have gone) until `end`: at every instant, what still runs then plus the
        claims begun by then plus the job, within the quota. Jobs that reach their wall before
        `start` free their room by themselves; jobs signalled in this pass leave when their grace
        ends; those signalled before that the job may take as `victim`s are counted as running on
        (they are the free victims a plan takes first, so its plan goes on naming them), the
        others leave when their grace ends."""
        out = {"org": 0, "project": 0}
        for scope, cap in self.capped(job, gpu_type):
            out[scope[0]] = max(0, self._peak(scope, start, end, victim) + job.gpu_count - cap)
        return out["org"], out["project"]

    def _peak(self, scope: Scope, start: float, end: float, victim: Callable[[RunningJob], bool]) -> int:
        kept = [
            (self.exit_at(r), r.gpu_count)
            for r in self.signalled.get(scope, ())
            if r.id not in self._exits and victim(r)
        ]

        def in_use(at: float) -> int:
            return self.in_use_after(scope, at) + sum(g for exit_at, g in kept if exit_at <= at)

        claims = sorted((c for c in self.claims.get(scope, ()) if c.start_at < end), key=_start)
        claimed = sum(c.gpus for c in claims if c.start_at <= start)
        best = in_use(start) + claimed
        for c in claims:
            if c.start_at > start:  # use only falls and claims only rise: the peak is at a start
                claimed += c.gpus
                best = max(best, in_use(c.start_at) + claimed)
        return best

    def in_use_after(self, scope: Scope, at: float) -> int:
        """GPUs of the scope's running and placed jobs that still run after `at`."""
        exits, after = self.index(scope)
        return after[bisect_right(exits, at)]

    def index(self, scope: Scope) -> tuple[list[float], list[int]]:
        """The scope's exit times ascending, and after[i] = GPUs of the jobs from the i-th on."""
        hit = self._index.get(scope)
        if hit is None:
            pairs = sorted(self.ends(scope))
            after = [0] * (len(pairs) + 1)
            for i in range(len(pairs) - 1, -1, -1):
                after[i] = after[i + 1] + pairs[i][1]
            hit = self._index[scope] = ([at for at, _ in pairs], after)
        return hit

    def ends(self, scope: Scope) -> list[tuple[float, int]]:
        """[(exit time, GPUs)] of the jobs running or placed in the scope."""
        if self._by_scope is None:
            self._by_scope = defaultdict(list)
            for r in self._running:
                for key in _scopes(r.org_id, r.project_id, r.gpu_type):
                    self._by_scope[key].append(r)
        out = []
        for r in self._by_scope.get(scope, ()):
            at = self._exits.get(r.id)
            out.append((self.exit_at(r) if at is None else at, r.gpu_count))
        return out + self._placed.get(scope, [])

    def exit_at(self, r: RunningJob) -> float:
        """When a running job is expected to free its GPUs: at its max wall, or at the end of its
        grace once signalled (now, if overdue)."""
        return max(self.now, r.ends_by(self._grace))

    def detail(self, job: PendingJob, types: Sequence[str]) -> str:
        """Which quota binds on each type, e.g. "concurrent-GPU quota: H100 project 6 of 8 in use,
        A100 org 4 of 4 in use; needs 4" (the first binding level per type); a quota smaller than
        the job says it must be raised, first (QA: a project quota below the job went unsaid while
        the org's bound too, as if the job would start once the org had room)."""
        parts, g = [], job.gpu_count
        for t in types:
            org = (self.quotas.org.get((job.org_id, t)), self.used[("org", job.org_id, t)])
            project = (self.quotas.project.get((job.project_id, t)),
                       self.used[("project", job.project_id, t)])
            level: Level
            if org[0] is not None and g > org[0]:
                level, (lim, used) = "org", org
            elif project[0] is not None and g > project[0]:
                level, (lim, used) = "project", project
            elif org[0] is not None and org[1] + g > org[0]:
                level, (lim, used) = "org", org
            else:
                level, (lim, used) = "project", project
            part = f"{t} {level} {used} of {lim} in use"
            if lim is not None and g > lim:
                part += " (a quota smaller than the job: it starts there only once the quota is raised)"
            parts.append(part)
        return f"concurrent-GPU quota: {', '.join(parts)}; needs {g}"

    # -- writing ----------------------------------------------------------------------------------
    def take(self, job: PendingJob, gpu_type: str, end: float) -> None:
        """A job placed in this pass, running until `end` (by its max wall)."""
        for scope in _scopes(job.org_id, job.project_id, gpu_type):
            self.used[scope] += job.gpu_count
            self._placed[scope].append((end, job.gpu_count))
            self._index.pop(scope, None)

    def leave(self, r: RunningJob, exit_at: float) -> None:
        """A running job signalled in this pass: its GPUs leave its scopes by `exit_at`."""
        if r.id in self._exits:
            return
        self._exits[r.id] = exit_at
        for scope in _scopes(r.org_id, r.project_id, r.gpu_type):
            self._index.pop(scope, None)

    def drop_claims(self, job_id: int) -> None:
        """A job placed after all (on a node before its maintenance window): its claims go."""
        for scope, claims in self.claims.items():
            if any(c.job_id == job_id for c in claims):
                self.claims[scope] = [c for c in claims if c.job_id != job_id]

    def claim(self, job: PendingJob, gpu_type: str, start_at: float, kind: str, end: float) -> None:
        for scope, cap in self.capped(job, gpu_type):
            held_back = self._held_back(scope, cap, job.gpu_count, end)
            self.claims[scope].append(Claim(job.id, start_at, job.gpu_count, kind, held_back))


def _scopes(org_id: int, project_id: int, gpu_type: str) -> tuple[Scope, Scope]:
    return ("org", org_id, gpu_type), ("project", project_id, gpu_type)


def _start(claim: Claim) -> float:
    return claim.start_at
