"""Job submission as one PostgreSQL statement: `jobs_submit` (docs/decisions/0006-…).

The API tries this first. It does in one function call what the idempotency claim and
`submit_job` do in five statements and a few thousand Python calls: claim the key, insert the
job, lock and check the budgets, place the hold (with the submission's audit event), count it in
the budgets and point the job at it. Everything it checks in Python first is `submit_job`'s own
code (`validate_spec`, `eligible_types`, `hold_seconds`, the catalog's prices).

It declines — returns None, having written nothing that will stay — whenever the answer could
differ from the Python path's: the key exists (a replay, a conflict or one in flight), the
request is invalid or forbidden, a budget level would be crossed (hard or soft), the funds are
short, a price changed between pricing and the transaction's clock, or a serialization failure
or deadlock (the Python path retries those). The caller then rolls back and runs the Python
path, which answers as it always has. So only a submission that will be accepted goes this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, DatabaseError, transaction
from django.utils import timezone

from accounts.models import Project
from accounts.selectors import can_submit
from config import metrics, prepared
from config.errors import DomainError
from config.request_context import current_request_id
from ledger.clock import clock_offset
from ledger.models import Hold, HoldState, TransactionKind
from ledger.retry import RETRYABLE_SQLSTATES, sqlstate_of
from ledger.services import _sql as ledger_sql
from scheduling.models import Job, JobAttempt, JobState, PriorityClass
from scheduling.pricing import catalog_knowing, hold_quote
from scheduling.services import submission
from scheduling.services.reservation import (
    eligible_types,
    hold_seconds,
    run_estimate,
    runnable_types,
    why_never_runs,
)
from scheduling.services.submission import JobSpec, validate_spec

# SQLSTATEs after which the Python path decides: GBFBK (`jobs_submit`: a budget level would be
# crossed, or the price moved), GB402 (`ledger_place_hold`: funds short), and the retryable ones.
DECLINE_SQLSTATES = frozenset({"GBFBK", ledger_sql.INSUFFICIENT_CREDITS, *RETRYABLE_SQLSTATES})

_SUBMIT_SQL = "SELECT * FROM jobs_submit(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
_SET_BY_SQL = {"id", "submitted_at", "updated_at"}


@dataclass(frozen=True, slots=True)
class Submitted:
    record_id: int  # the idempotency record, in flight until the caller completes it
    job: Job
    hold: Hold


def enabled() -> bool:
    return bool(getattr(settings, "JOBS_SUBMIT_IN_SQL", True)) and ledger_sql.enabled()


@cache
def _job_columns() -> tuple[tuple[str, str], ...]:
    """(column, attribute) of every Job column the caller fills (the function sets the rest)."""
    return tuple(
        (f.column, f.attname) for f in Job._meta.concrete_fields if f.column not in _SET_BY_SQL
    )


def submit_job_in_sql(
    *, user: Any, project: Project, spec: JobSpec, idempotency_key: str, principal: str,
    fingerprint: str,
) -> Submitted | None:
    """Claim the key and submit the job in one statement, in the caller's transaction.

    None: declined (see the module docstring); the caller must roll its transaction back.
    A claim that waited out `IDEMPOTENCY_LOCK_WAIT_MS` raises (SQLSTATE 55P03) for the caller's
    idempotency layer to answer "in flight".
    """
    if not can_submit(user, project) or spec.depends_on or spec.held:  # those: the Python path
        return None
    try:
        snap = catalog_knowing(gpu_types=spec.gpu_types, priority_class=spec.priority_class,
                               regions=spec.regions)
        cls, preemptible = validate_spec(spec, snap, project.org_id)
        types = eligible_types(list(spec.gpu_types), spec.gpu_memory_gb, snap)
        if why_never_runs(snap, types, spec.gpu_count, spec.regions, project.org_id, project.pk):
            return None  # the Python path re-checks on a fresh catalog and refuses (or accepts)
        job = Job(
            org_id=project.org_id, project=project, user=user, name=spec.name,
            gpu_types=list(spec.gpu_types), gpu_count=spec.gpu_count,
            gpu_memory_gb=spec.gpu_memory_gb, max_wall_seconds=spec.max_wall_seconds,
            priority_class_id=cls.id, preemptible=preemptible, command=spec.command,
            regions=list(spec.regions), state=JobState.QUEUED,
        )
        job.org = project.org
        priced = runnable_types(snap, types, spec.gpu_count, spec.regions, project.org_id, project.pk)
        quote = hold_quote(gpu_types=priced, gpu_count=spec.gpu_count, seconds=hold_seconds(job),
                           at=timezone.now())
    except DomainError:
        return None
    job.estimate = run_estimate(job, quote.rate)
    hold_types = sorted(set(types))
    row = {column: getattr(job, attname) for column, attname in _job_columns()}
    audit = {"project": project.pk, "idempotency_key": idempotency_key[:255],
             "gpu_types": list(spec.gpu_types), "gpu_count": spec.gpu_count}
    try:
        status, record_id, job_id, now, hold_id, hold_created = prepared.execute(_SUBMIT_SQL, [
            principal, idempotency_key, fingerprint, int(settings.IDEMPOTENCY_KEY_TTL_SECONDS),
            str(int(settings.IDEMPOTENCY_LOCK_WAIT_MS)), orjson.dumps(row).decode(),
            orjson.dumps(hold_types).decode(), quote.amount, quote.valid_from, quote.valid_until,
            clock_offset(), current_request_id(), orjson.dumps(audit).decode(),
        ])
    except DatabaseError as error:
        if sqlstate_of(error) in DECLINE_SQLSTATES:
            return None
        raise
    if status != "ok":  # the key exists: nothing was written
        return None
    job.pk, job.submitted_at, job.updated_at = job_id, now, now
    job._state.adding, job._state.db = False, DEFAULT_DB_ALIAS
    job.priority_class = PriorityClass(id=cls.id, name=cls.name, preemptible=cls.preemptible)
    job._prefetched_objects_cache = {"attempts": JobAttempt.objects.none(), "depends_on": []}
    reference = f"job:{job_id}"
    hold = Hold.from_db(DEFAULT_DB_ALIAS, None, (
        hold_id, project.org_id, project.pk, user.pk, f"{reference}:submit", reference, hold_types,
        HoldState.ACTIVE, quote.amount, 0, 0, hold_created, None,
    ))
    job.current_hold = hold
    metrics.ledger_movement(kind=TransactionKind.HOLD, amount=quote.amount, settled=False)
    transaction.on_commit(submission._schedule_soon)  # looked up now: tests replace it
    return Submitted(record_id=int(record_id), job=job, hold=hold)

