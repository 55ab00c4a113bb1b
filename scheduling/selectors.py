"""Reads for the API: a queued job's place in the queue and its priority explained.

The whole queue is ordered by the core's own `queue_order` on a fresh snapshot (what the next
pass would walk), so the answer cannot drift from the scheduler. Ordering 10,000 pending jobs
costs about a pass's load plus a sort (docs/benchmarks.md, "queue view"), so one ordering serves
every caller for `SCHEDULER_QUEUE_VIEW_SECONDS` (default 5, the tick). It is cached in
`BUCKETS` entries by job id under a version, plus a small current-version entry: a read fetches
two entries and unpickles 1/64 of the queue instead of all of it, and a write is 65 entries, not
one per job (10,000 separate entries took longer to write than the ordering itself). A queued job
missing from it (submitted or re-queued since) orders the queue afresh.

An ordering past its freshness is kept `STALE_FACTOR` times as long: the first caller to find it
stale claims the refresh (`cache.add`, one at a time) and orders the queue; the callers meanwhile
are answered from the stale ordering instead of all ordering the queue at once (stale while
revalidate: a 10,000-job queue costs ~1 s to order, and a burst of page loads would otherwise
each pay it).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.cache import cache
from django.db.models import Sum

from config.clock import db_now
from config.errors import DomainError
from scheduling import core
from scheduling.adapter.snapshot import load_snapshot
from scheduling.core import reasons
from scheduling.models import Job, JobAttempt, JobRefund, JobState

CURRENT_KEY = "scheduling:queue-view:current"  # (version, computed_at, queue length, fresh until)
REFRESH_KEY = "scheduling:queue-view:refreshing"  # held by the one caller ordering the queue again
DEFAULT_CACHE_SECONDS = 5.0
STALE_FACTOR = 3
BUCKETS = 64


class JobNotQueued(DomainError):
    """Only a queued job has a place in the queue."""

    type = "job-not-queued"
    status = 409
    title = "The job is not queued"


def cache_seconds() -> float:
    return float(getattr(settings, "SCHEDULER_QUEUE_VIEW_SECONDS", DEFAULT_CACHE_SECONDS))


def _bucket_key(version: str, job_id: int) -> str:
    return f"scheduling:queue-view:{version}:{job_id % BUCKETS}"


@dataclass(frozen=True, slots=True)
class JobStanding:
    """One queued job's answer: its standing, or None while the pass does not consider it (held,
    a retry backoff until `not_before`, or dependencies not met)."""

    job: Job
    computed_at: datetime
    queue_length: int
    standing: core.Standing | None


def order_queue() -> tuple[datetime, dict[int, core.Standing]]:
    """Order the queue now and publish it to the cache (entries first, then the version)."""
    now = db_now()
    standings = {s.job_id: s for s in core.queue_order(load_snapshot(now=now).snapshot)}
    seconds = cache_seconds()
    if seconds > 0:
        version = uuid.uuid4().hex
        buckets: dict[str, dict[int, core.Standing]] = {_bucket_key(version, b): {} for b in range(BUCKETS)}
        for job_id, standing in standings.items():
            buckets[_bucket_key(version, job_id)][job_id] = standing
        kept = seconds * STALE_FACTOR
        cache.set_many(buckets, timeout=kept)
        cache.set(CURRENT_KEY, (version, now, len(standings), time.time() + seconds), timeout=kept)
    return now, standings


@dataclass(frozen=True, slots=True)
class Standings:
    """Queued jobs' standings from one ordering (None: in retry backoff, not considered yet)."""

    computed_at: datetime
    queue_length: int
    by_job: dict[int, core.Standing | None]


def standings_of(jobs: list[Job]) -> Standings:
    """The standings of these queued jobs: two cache reads while an ordering is current, else
    (or when one of them is missing from it, not in backoff) a fresh ordering."""
    now = db_now()
    # A job not offered now (held, say, since the ordering was made) has no place, cached or not.
    offered = {job.pk for job in jobs if not _not_offered(job, now)}
    current = cache.get(CURRENT_KEY) if cache_seconds() > 0 else None
    claimed = False
    if current is not None:
        version, computed_at, length, fresh_until = current
        keys = {pk: _bucket_key(version, pk) for pk in offered}
        buckets = cache.get_many(set(keys.values()))
        found = {pk: buckets.get(keys[pk], {}).get(pk) for pk in offered}
        if all(standing is not None for standing in found.values()):
            by_job = {job.pk: found.get(job.pk) for job in jobs}
            if time.time() < fresh_until:
                return Standings(computed_at, length, by_job)
            claimed = cache.add(REFRESH_KEY, 1, timeout=60)
            if not claimed:  # another caller is ordering the queue: the stale answer meanwhile
                return Standings(computed_at, length, by_job)
    try:
        computed_at, standings = order_queue()
    finally:
        if claimed:
            cache.delete(REFRESH_KEY)
    by_job = {job.pk: standings.get(job.pk) if job.pk in offered else None for job in jobs}
    return Standings(computed_at, len(standings), by_job)


def _not_offered(job: Job, now: datetime) -> bool:
    """Not in the scheduler's queue: held, in retry backoff, waiting for its funding retry (as
    `snapshot.offered_queued`; review: read as in the queue, it reordered the queue at every
    read), waiting for its dependencies, or for a grant of its priority class."""
    backoff = job.not_before is not None and job.not_before > now
    funding = job.funding_retry_at is not None and job.funding_retry_at > now
    not_in_queue = job.wait_reason in (reasons.DEPENDENCY, reasons.CLASS_NOT_GRANTED)
    return job.held or backoff or funding or not_in_queue


def job_standing(job: Job) -> JobStanding:
    if job.state != JobState.QUEUED:
        raise JobNotQueued(
            f"Job {job.pk} is {job.state}; only a queued job has a place in the queue.", job_id=job.pk
        )
    found = standings_of([job])
    return JobStanding(job, found.computed_at, found.queue_length, found.by_job[job.pk])


def job_charged(job_id: int, *, attempt_number: int | None = None) -> int:
    """What a job (or one of its attempts) was charged: the captures on its attempts' holds."""
    from ledger.models import Hold

    attempts = JobAttempt.objects.filter(job_id=job_id)
    if attempt_number is not None:
        attempts = attempts.filter(number=attempt_number)
    total = Hold.objects.filter(pk__in=attempts.values("hold_id")).aggregate(total=Sum("captured"))["total"]
    return int(total or 0)


def job_refunded(job_id: int, *, attempt_number: int | None = None) -> int:
    """What finance refunded for a job (all its refunds), or for one attempt (those naming it)."""
    refunds = JobRefund.objects.filter(job_id=job_id)
    if attempt_number is not None:
        refunds = refunds.filter(attempt__number=attempt_number)
    return int(refunds.aggregate(total=Sum("amount"))["total"] or 0)
