"""Read-only queries behind the pages (the balance math itself lives in ledger.selectors)."""

from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import (
    Case,
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    IntegerField,
    Min,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Greatest, TruncMinute

from accounts.selectors import visible_projects
from config.clock import db_now
from ledger.models import Account, Posting
from scheduling.models import (
    RAN_SINCE_RELEASE,
    TERMINAL_JOB_STATES,
    Allocation,
    AttemptState,
    Job,
    JobAttempt,
    JobState,
    Node,
)


def own_jobs(*, user: AbstractBaseUser) -> QuerySet[Job]:
    """The jobs the user submitted in projects they still see (`GET /api/v1/jobs` and the job's
    page read the same projects): someone who left an org no longer follows its jobs (review: the
    home page kept listing them, with their state, wait reason and place in the queue)."""
    return Job.objects.filter(user=user, project__in=visible_projects(user))


def user_jobs(*, user: AbstractBaseUser, limit: int = 50) -> QuerySet[Job]:
    """The user's jobs (`own_jobs`), live and waiting ones first, then the most recent."""
    unfinished = Case(
        When(state__in=TERMINAL_JOB_STATES, then=1), default=0, output_field=IntegerField()
    )
    return (
        own_jobs(user=user)
        .select_related("org", "project", "priority_class")
        .annotate(finished=unfinished)
        .order_by("finished", "-submitted_at", "-id")[:limit]
    )


def running_attempts(*, limit: int = 200) -> QuerySet[JobAttempt]:
    """Live attempts (placed, running or stopping) with their job, org and usage."""
    return (
        JobAttempt.objects.exclude(state=AttemptState.ENDED)
        .select_related("job__org", "job__project", "job__user", "gpu_type", "usage")
        .order_by("scheduled_at", "id")[:limit]
    )


def node_usage() -> QuerySet[Node]:
    """Every node with its allocated GPU count and the mean reported utilization of its jobs."""
    live = Q(allocations__released_at__isnull=True)
    return (
        Node.objects.select_related("gpu_type")
        .annotate(allocated=Count("allocations", filter=live))
        .order_by("gpu_type__name", "name")
    )


def node_utilization() -> dict[int, float]:
    """Mean telemetry utilization (0-100 %) per node over its live allocations."""
    rows: dict[int, list[float]] = {}
    allocations = Allocation.objects.filter(
        released_at__isnull=True, attempt__usage__gpu_utilization__isnull=False
    ).values_list("node_id", "attempt__usage__gpu_utilization")
    for node_id, utilization in allocations:
        rows.setdefault(node_id, []).append(utilization)
    return {node_id: sum(values) / len(values) for node_id, values in rows.items()}


def consumption_by_org(*, minutes: int = 60, bins: int = 12) -> list[dict]:
    """Credits captured (consumption postings) per org over the last `minutes`, in `bins` slices.

    Returns [{"org_id", "org", "amount", "series": [amount per slice, oldest first]}].
    """
    now = db_now()
    since = now - timedelta(minutes=minutes)
    width = timedelta(minutes=minutes) / bins
    # Grouped by minute in the database: at most minutes x orgs rows, however hot the hour.
    rows = (
        Posting.objects.filter(account=Account.CONSUMPTION, transaction__created_at__gt=since)
        .annotate(minute=TruncMinute("transaction__created_at"))
        .values("org_id", "transaction__org__slug", "minute")
        .annotate(amount=Sum("amount"))
    )
    by_org: dict[int, dict] = {}
    for row in rows:
        entry = by_org.setdefault(
            row["org_id"],
            {"org_id": row["org_id"], "org": row["transaction__org__slug"], "amount": 0,
             "series": [0] * bins},
        )
        slot = min(max(int((row["minute"] - since) / width), 0), bins - 1)
        entry["amount"] += row["amount"]
        entry["series"][slot] += row["amount"]
    return sorted(by_org.values(), key=lambda entry: (-entry["amount"], entry["org"]))


def gpus_in_use_series(*, minutes: int = 60, step_minutes: int = 5) -> list[int]:
    """GPUs allocated at each step over the last `minutes`, oldest first, the last one now.

    Read from the allocation history (every allocation keeps its start and release), so the
    chart is the same whenever the page is opened. One query: a filtered count per instant over
    the allocations that overlap the window.
    """
    now = db_now()
    steps = minutes // step_minutes
    instants = [now - timedelta(minutes=step_minutes * (steps - i)) for i in range(steps + 1)]
    live_at = {
        f"at_{i}": Count(
            "id", filter=Q(allocated_at__lte=t) & (Q(released_at__isnull=True) | Q(released_at__gt=t))
        )
        for i, t in enumerate(instants[:-1])
    }
    # Now = every allocation not released, exactly what the GPU tables count (an allocation
    # stamped a moment after this transaction's clock reading is still in use now).
    live_at[f"at_{steps}"] = Count("id", filter=Q(released_at__isnull=True))
    counts = Allocation.objects.filter(
        Q(released_at__isnull=True) | Q(released_at__gt=instants[0])
    ).aggregate(**live_at)
    return [counts[f"at_{i}"] for i in range(len(instants))]


def queue_by_org_and_reason() -> list[dict]:
    """Queued jobs per (org, wait reason): how many, how many GPUs they ask for, and since when the
    longest-waiting one has waited.

    A job waits from its submission, or from its release (`aging_from`) when later; the time it
    ran since in earlier attempts (preempted, evicted) is not waiting, so it moves that instant
    later, as the scheduler's aging counts it (`run_seconds`, `prior_run_seconds`; aging also
    starts no earlier than a job's last dependency ended, which this does not read).

    Returns [{"org_id", "reason", "jobs", "gpus", "oldest"}]; `reason` is "" for a job no
    scheduling pass has looked at yet.
    """
    ran = Subquery(
        JobAttempt.objects.filter(job_id=OuterRef("pk"), ended_at__isnull=False, started_at__isnull=False)
        .filter(RAN_SINCE_RELEASE)
        .values("job_id")
        .annotate(total=Sum(F("ended_at") - F("started_at"), output_field=DurationField()))
        .values("total"),
        output_field=DurationField(),
    )
    waiting_since = ExpressionWrapper(
        Greatest("submitted_at", Coalesce("aging_from", "submitted_at"))
        + Coalesce(ran, Value(timedelta(0)), output_field=DurationField()),
        output_field=DateTimeField(),
    )
    rows = (
        Job.objects.filter(state=JobState.QUEUED)
        .annotate(waiting_since=waiting_since)
        .values("org_id", "wait_reason")
        .annotate(jobs=Count("id"), gpus=Sum("gpu_count"), oldest=Min("waiting_since"))
        .order_by()
    )
    return [
        {"org_id": r["org_id"], "reason": r["wait_reason"], "jobs": r["jobs"], "gpus": r["gpus"],
         "oldest": r["oldest"]}
        for r in rows
    ]
