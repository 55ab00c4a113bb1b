"""Sweeps and reconciliation: nothing stays stranded, nothing is refunded twice.

Each sweep claims rows with `SELECT … FOR UPDATE SKIP LOCKED` and re-checks after locking, so two
workers (or two beats) running it at once split the work instead of doubling it; the hold state
machine makes a repeat a no-op. Node liveness (silent -> unknown -> down, attempts ended `lost`)
is the scheduler's sweep (`scheduling.services.tick.sweep_nodes`), using this app's timeouts.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.core.cache import cache
from django.db import transaction
from django.db.models import Exists, OuterRef, Sum

from audit.services import record
from config.clock import db_now
from config.snapshot import one_snapshot
from ledger.models import Hold, HoldState, LedgerTransaction, TransactionKind
from ledger.retry import retry_on_conflict
from ledger.services import expire_due_buckets, release_hold
from ledger.verification import verify_ledger
from metering import conf, metrics
from metering.charging import charge_progress
from metering.cost import cost
from metering.models import AttemptUsage
from metering.settlement import settle_attempt
from scheduling.models import TERMINAL_JOB_STATES, AttemptState, Job, JobAttempt, JobState

log = logging.getLogger(__name__)
LIVE_ATTEMPTS = (AttemptState.SCHEDULED, AttemptState.RUNNING, AttemptState.STOPPING)
# Job states in which a hold is legitimately active without a running attempt.
HOLDING_JOB_STATES = (JobState.QUEUED, JobState.SCHEDULED, JobState.RUNNING, JobState.PREEMPTED)
MAX_ALERTS_PER_CHECK = 50


def _stranded_filter() -> tuple[Exists, Exists]:
    live_attempt = Exists(JobAttempt.objects.filter(hold_id=OuterRef("pk"), state__in=LIVE_ATTEMPTS))
    waiting_job = Exists(Job.objects.filter(current_hold_id=OuterRef("pk"), state__in=HOLDING_JOB_STATES))
    return live_attempt, waiting_job


def release_stranded_holds(*, limit: int = 200) -> dict[str, int]:
    """Settle active holds nothing runs or waits on (a lost finish, a crashed submission, a terminal
    job whose release never happened): on the attempt's billable usage if one ran, else in full."""
    deadline = db_now() - timedelta(seconds=conf.seconds("METERING_STRANDED_HOLD_AFTER_S"))
    live_attempt, waiting_job = _stranded_filter()
    ids = list(
        Hold.objects.filter(state=HoldState.ACTIVE, created_at__lt=deadline)
        .exclude(live_attempt)
        .exclude(waiting_job)
        .order_by("pk")
        .values_list("pk", flat=True)[:limit]
    )
    done = {"settled": 0, "released": 0}
    for hold_id in ids:
        kind = _settle_stranded(hold_id)
        if kind:
            done[kind] += 1
            metrics.SWEEP_ACTIONS.labels(f"stranded_{kind}").inc()
    return done


@retry_on_conflict()
@transaction.atomic
def _settle_stranded(hold_id: int) -> str:
    from budgets.services import record_release

    live_attempt, waiting_job = _stranded_filter()
    # Claim the hold; another sweep (or a finishing attempt) holding it means it is being handled.
    hold = (
        Hold.objects.select_for_update(of=("self",), skip_locked=True)
        .filter(pk=hold_id, state=HoldState.ACTIVE)
        .exclude(live_attempt)
        .exclude(waiting_job)
        .first()
    )
    if hold is None:
        return ""
    attempt = JobAttempt.objects.filter(hold_id=hold.pk).order_by("-pk").first()
    if attempt is not None:
        settle_attempt(attempt=attempt, outcome=attempt.outcome or "reconciled")
        kind = "settled"
    else:
        if hold.remaining:
            record_release(hold=hold, amount=hold.remaining)
        release_hold(hold=hold, key="stranded", reason="stranded hold: no job runs or waits on it")
        kind = "released"
    record(
        action="metering.stranded_hold",
        subject_type="hold",
        subject_id=hold.pk,
        org_id=hold.org_id,
        reason_code=kind,
        data={"attempt": attempt.pk if attempt is not None else None},
    )
    return kind


def charge_running(*, limit: int = 1000) -> dict[str, int]:
    """charge_progress over running attempts (each in its own transaction)."""
    attempts = list(
        JobAttempt.objects.filter(state__in=(AttemptState.RUNNING, AttemptState.STOPPING))
        .order_by("pk")
        .only("pk", "job_id", "hold_id")[:limit]
    )
    counts: dict[str, int] = {}
    for attempt in attempts:
        try:
            result = charge_progress(attempt=attempt)
        except Exception:  # one attempt's failure must not stop charging the others
            log.exception("charge_progress failed for attempt %s", attempt.pk)
            counts["errors"] = counts.get("errors", 0) + 1
            continue
        for action in result.actions:
            counts[action.value] = counts.get(action.value, 0) + 1
    return counts


def expire_buckets() -> int:
    """The expiry sweep: available credit of expired buckets -> expiry (idempotent by bucket state)."""
    total = 0
    while True:
        n = expire_due_buckets(limit=500)
        total += n
        if n < 500:
            return total


@dataclass
class Reconciliation:
    """The nightly checks' findings; every list empty means the books agree."""

    ledger: list[str] = field(default_factory=list)
    terminal_with_active_hold: list[str] = field(default_factory=list)
    captured_mismatch: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "ledger": len(self.ledger),
            "terminal_with_active_hold": len(self.terminal_with_active_hold),
            "captured_mismatch": len(self.captured_mismatch),
        }

    @property
    def clean(self) -> bool:
        return not any(self.counts().values())


def _terminal_with_active_hold() -> list[str]:
    terminal = Job.objects.filter(state__in=TERMINAL_JOB_STATES)
    by_current = terminal.filter(current_hold__state=HoldState.ACTIVE).values_list("pk", "current_hold_id")
    by_attempt = JobAttempt.objects.filter(
        job__state__in=TERMINAL_JOB_STATES, hold__state=HoldState.ACTIVE
    ).values_list("job_id", "hold_id")
    pairs = sorted(set(by_current) | set(by_attempt))
    return [f"job {job} is terminal but hold {hold} is active" for job, hold in pairs]


def _captured_mismatches(since_days: int | None) -> list[str]:
    """Per settled attempt: captured == min(cost(billable usage) at its rate, what the hold held
    when it settled): its authorization less what was released before the settlement (the excess
    given back at placement, a reduction), which the final capture could not take (review: a run
    that used more than its hold kept after such a release was reported as a mismatch)."""
    qs = JobAttempt.objects.filter(state=AttemptState.ENDED, hold__state=HoldState.SETTLED)
    if since_days is not None:
        qs = qs.filter(ended_at__gte=db_now() - timedelta(days=since_days))
    billable = dict(AttemptUsage.objects.filter(attempt__in=qs).values_list("attempt_id", "billable_gpu_ms"))
    released_early = dict(
        LedgerTransaction.objects.filter(
            kind=TransactionKind.RELEASE, hold_id__in=qs.values("hold_id"), params__final=False
        ).values("hold_id").annotate(total=Sum("amount")).values_list("hold_id", "total")
    )
    problems = []
    rows = qs.values_list("pk", "rate_per_gpu_hour", "hold_id", "hold__captured", "hold__authorized")
    for attempt_id, rate, hold_id, captured, authorized in rows.iterator(chunk_size=2000):
        held = authorized - released_early.get(hold_id, 0)
        expected = min(cost(billable.get(attempt_id, 0), rate), held)
        if captured != expected:
            problems.append(
                f"attempt {attempt_id}: hold {hold_id} captured {captured}, usage costs {expected}"
            )
    return problems


def reconcile(*, since_days: int | None = 2) -> Reconciliation:
    """verify_ledger + every terminal job's holds settled + captured = cost(usage) per attempt.

    Discrepancies become audit alert events and the `gpubank_reconciliation_discrepancies` metric.
    """
    with one_snapshot():  # reads that agree with each other (review: false alarms under load)
        found = Reconciliation(
            ledger=verify_ledger(),
            terminal_with_active_hold=_terminal_with_active_hold(),
            captured_mismatch=_captured_mismatches(since_days),
        )
    for check, lines in (
        ("ledger", found.ledger),
        ("terminal_with_active_hold", found.terminal_with_active_hold),
        ("captured_mismatch", found.captured_mismatch),
    ):
        for line in lines[:MAX_ALERTS_PER_CHECK]:
            record(
                action="metering.reconciliation_alert",
                subject_type="reconciliation",
                subject_id=check,
                reason_code=check,
                data={"detail": line, "total": len(lines)},
            )
    cache.set(metrics.RECONCILIATION_CACHE_KEY, {"counts": found.counts(), "at": time.time()}, None)
    return found
