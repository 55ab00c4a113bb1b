"""An organization's statement for one calendar month (UTC), from the journal alone.

Opening and closing balance (what its buckets hold: available + held) and, in between, what was
issued, refunded (credits given back for jobs' charges), consumed, expired and voided, read from the
postings of the system accounts. Double entry makes it add up:
closing = opening + issued + refunded - consumed - expired - voided, whatever happened. Each
consumption line is one project and GPU type: the captures of the month on holds of that project,
their GPU type and GPU-hours read from the job attempt each hold paid for (its rate is fixed for the
run, so GPU-hours = amount / rate). Captures on holds of no attempt have no GPU type.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Q, Sum

from accounts.models import Organization
from config.months import month_bounds
from config.snapshot import one_snapshot
from ledger.clock import clock_offset, ledger_now
from ledger.models import Account, Bucket, LedgerTransaction, Posting, TransactionKind

BUCKET_ACCOUNTS = (Account.BUCKET_AVAILABLE, Account.BUCKET_HELD)


@dataclass(frozen=True, slots=True)
class Balance:
    available: int
    held: int

    @property
    def total(self) -> int:
        return self.available + self.held


@dataclass(frozen=True, slots=True)
class ConsumptionLine:
    project_id: int | None
    project: str
    gpu_type: str
    amount: int
    gpu_hours: float


@dataclass(frozen=True, slots=True)
class Issue:
    at: datetime
    bucket_id: int
    reference: str
    kind: str
    source: str
    amount: int


@dataclass(frozen=True, slots=True)
class Refund:
    at: datetime
    bucket_id: int
    reference: str
    job_id: int | None
    attempt: int | None  # the attempt's number, None for a refund of the whole job
    amount: int
    reason: str


@dataclass(slots=True)
class Statement:
    org_id: int
    month: str
    starts_at: datetime
    ends_at: datetime  # the month's end, or now for the month in progress
    opening: Balance
    closing: Balance
    issued: int = 0
    consumed: int = 0
    expired: int = 0
    voided: int = 0
    refunded: int = 0
    consumption: list[ConsumptionLine] = field(default_factory=list)
    issues: list[Issue] = field(default_factory=list)
    refunds: list[Refund] = field(default_factory=list)
    final: bool = False  # the month has ended and nothing more can be dated in it: see _settled


MONTH_PATTERN = r"^[0-9]{4}-[0-9]{2}\Z"  # ASCII digits only (str.isdigit also takes full-width ones)
MONTH = re.compile(MONTH_PATTERN)
MONTH_MESSAGE = "A month as YYYY-MM, e.g. 2026-11."


def parse_month(month: str) -> tuple[datetime, datetime]:
    """`YYYY-MM` -> [first instant, first instant of the next month), UTC. ValueError if malformed."""
    if not MONTH.match(month):
        raise ValueError(MONTH_MESSAGE)
    year, number = int(month[:4]), int(month[5:])
    if not (1 <= number <= 12 and 2000 <= year <= 9998):
        raise ValueError(f"{month} is not a month this ledger can have.")
    return month_bounds(datetime(year, number, 1, tzinfo=UTC))


def _balance(org_id: int, before: datetime) -> Balance:
    sums = dict(
        Posting.objects.filter(org_id=org_id, account__in=BUCKET_ACCOUNTS, transaction__created_at__lt=before)
        .values_list("account").annotate(total=Sum("amount")).order_by()
    )
    return Balance(int(sums.get(Account.BUCKET_AVAILABLE, 0)), int(sums.get(Account.BUCKET_HELD, 0)))


def _consumption(org_id: int, in_month: Q) -> list[ConsumptionLine]:
    from scheduling.models import JobAttempt  # the ledger knows holds; attempts say what they paid for

    captures = list(
        LedgerTransaction.objects.filter(in_month, org_id=org_id, kind=TransactionKind.CAPTURE)
        .values_list("hold_id", "hold__project_id", "hold__project__slug").annotate(total=Sum("amount"))
        .order_by()
    )
    runs = {
        hold_id: (gpu_type, rate)
        for hold_id, gpu_type, rate in JobAttempt.objects.filter(hold_id__in=[c[0] for c in captures])
        .values_list("hold_id", "gpu_type__name", "rate_per_gpu_hour").order_by("pk")
    }
    lines: dict[tuple[int | None, str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for hold_id, project_id, slug, total in captures:
        gpu_type, rate = runs.get(hold_id, ("", 0))
        line = lines[(project_id, slug or "", gpu_type)]
        line[0] += int(total)
        line[1] += int(total) / rate if rate else 0.0
    return [
        ConsumptionLine(project_id, slug, gpu_type, int(amount), round(hours, 6))
        for (project_id, slug, gpu_type), (amount, hours) in sorted(
            lines.items(), key=lambda item: (item[0][1], item[0][2]))
    ]


def org_statement(*, org: Organization, month: str) -> Statement:
    """The statement of `org` for `month` (`YYYY-MM`); the month in progress ends now.
    ValueError for a malformed month or one that has not begun.

    Its figures come from several queries, read in one snapshot (REPEATABLE READ on PostgreSQL),
    so a capture committing meanwhile is in all of them or in none, and it adds up. A transaction
    is dated by its start: one that began in the last instants of a month and commits after it
    ended still lands in that month, so a month's statement can change for a few seconds after;
    `final` says when it no longer can (checked before the snapshot is taken; inside a caller's
    transaction, whose snapshot may be older, as tests read it, that order is the caller's)."""
    settled = _settled(parse_month(month)[1])
    with one_snapshot():
        statement = _statement(org=org, month=month)
    statement.final = settled
    return statement


# Another connection's transaction that began before the cutoff; a session whose activity this
# role may not read (PostgreSQL then hides its backend_type, state and xact_start: grant the role
# pg_read_all_stats); or a prepared (two-phase) transaction, which pg_stat_activity no longer shows.
_OPEN_BEFORE = """
    SELECT EXISTS (
        SELECT 1 FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()
          AND ((backend_type = 'client backend' AND xact_start < %s) OR backend_type IS NULL)
    ) OR EXISTS (SELECT 1 FROM pg_prepared_xacts WHERE database = current_database())
"""


def _settled(month_end: datetime) -> bool:
    """Whether nothing more can be dated before `month_end`: the ledger clock has passed it and no
    other connection has a transaction open that began before it (PostgreSQL; on SQLite, one writer
    at a time, the clock alone). A ledger transaction is dated by its start, so one begun earlier
    may still commit into the month; one begun after this check is dated after it. Read before the
    statement's snapshot, so whatever committed before the check is in it. Conservative: a session
    this role cannot see (another role's, without pg_read_all_stats) or a prepared transaction
    keeps every month provisional."""
    if ledger_now() < month_end:
        return False
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        cursor.execute(_OPEN_BEFORE, [month_end - clock_offset()])
        (open_before,) = cursor.fetchone()
    return not open_before


def _statement(*, org: Organization, month: str) -> Statement:
    starts, ends = parse_month(month)
    now = ledger_now()
    if starts > now:
        raise ValueError(f"{month} has not begun.")
    ends = min(ends, now + timedelta(microseconds=1))  # the month in progress: up to now, inclusive
    in_month = Q(created_at__gte=starts, created_at__lt=ends)
    statement = Statement(org_id=org.pk, month=month, starts_at=starts, ends_at=ends,
                          opening=_balance(org.pk, starts), closing=_balance(org.pk, ends))
    system = dict(
        Posting.objects.filter(org_id=org.pk, bucket__isnull=True, transaction__created_at__gte=starts,
                               transaction__created_at__lt=ends)
        .values_list("account").annotate(total=Sum("amount")).order_by()
    )
    statement.issued = -int(system.get(Account.ISSUANCE, 0))
    statement.consumed = int(system.get(Account.CONSUMPTION, 0))
    statement.expired = int(system.get(Account.EXPIRY, 0))
    statement.voided = int(system.get(Account.VOID, 0))
    statement.refunded = -int(system.get(Account.REFUND, 0))
    statement.consumption = _consumption(org.pk, in_month)
    issued = Posting.objects.filter(
        org_id=org.pk, account=Account.BUCKET_AVAILABLE, transaction__kind=TransactionKind.ISSUE,
        transaction__created_at__gte=starts, transaction__created_at__lt=ends,
    ).values_list("transaction__created_at", "bucket_id", "amount").order_by("transaction__created_at", "pk")
    buckets = Bucket.objects.in_bulk([bucket_id for _, bucket_id, _ in issued])
    statement.issues = [
        Issue(at, bucket_id, buckets[bucket_id].reference, buckets[bucket_id].kind, buckets[bucket_id].source,
              int(amount))
        for at, bucket_id, amount in issued
    ]
    refunds = (
        LedgerTransaction.objects.filter(in_month, org_id=org.pk, kind=TransactionKind.REFUND)
        .values_list("created_at", "params", "amount", "memo").order_by("created_at", "pk")
    )
    references = dict(Bucket.objects.filter(pk__in=[p.get("bucket") for _, p, _, _ in refunds])
                      .values_list("pk", "reference"))
    statement.refunds = [
        Refund(at, params.get("bucket"), references.get(params.get("bucket"), ""), params.get("job"),
               params.get("attempt"), int(amount), memo)
        for at, params, amount, memo in refunds
    ]
    return statement
