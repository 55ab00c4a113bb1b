"""The fleet (GPU types, prices, nodes), priority classes, quotas, jobs, attempts, allocations."""

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q
from simple_history.models import HistoricalRecords

from accounts.models import Organization, Project, Region
from ledger.amounts import MAX_AMOUNT


class GpuType(models.Model):
    """A kind of GPU (A100, H100, ...) with its memory per GPU."""

    name = models.CharField(max_length=32, unique=True)
    memory_gb = models.PositiveIntegerField()
    history = HistoricalRecords()

    class Meta:
        verbose_name = "GPU type"
        verbose_name_plural = "GPU types"

    def __str__(self) -> str:
        return self.name


PRICE_MESSAGE = "A price must be positive: at least 1 micro-credit per GPU-hour."
# The largest job the API accepts (1,024 GPUs for 30 days) must cost at most what one ledger call
# may move (QA: a price of 2^63 - 1 was accepted, and every large submission then failed with a 500).
MAX_PRICE = MAX_AMOUNT // (1024 * 30 * 24)
# A wait, end or stop detail in words: room for why and the ledger's refusal in one sentence
# (review: at 255 a window-floor top-up's refusal lost its amounts).
DETAIL_MAX_LENGTH = 1000
MAX_PRICE_MESSAGE = (f"A price may be at most {MAX_PRICE} micro-credits per GPU-hour, so that the largest "
                     "job (1,024 GPUs for 30 days) stays within what one hold may be.")


class GpuPrice(models.Model):
    """Price per GPU-hour of a GPU type, in micro-credits, from `effective_from` on."""

    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="prices")
    # Validated here too, so a form names the field (QA: the admin answered a price of 0 with the
    # raw "Constraint “gpu_price_positive” is violated.").
    price_per_gpu_hour = models.BigIntegerField(validators=[
        MinValueValidator(1, PRICE_MESSAGE), MaxValueValidator(MAX_PRICE, MAX_PRICE_MESSAGE)])
    effective_from = models.DateTimeField()
    history = HistoricalRecords()

    class Meta:
        verbose_name = "GPU price"
        verbose_name_plural = "GPU prices"
        constraints = [
            models.UniqueConstraint(fields=["gpu_type", "effective_from"], name="gpu_price_unique"),
            models.CheckConstraint(
                condition=Q(price_per_gpu_hour__gt=0), name="gpu_price_positive",
                violation_error_message=PRICE_MESSAGE,
            ),
            models.CheckConstraint(  # the validators' cap, for writes that skip them
                condition=Q(price_per_gpu_hour__lte=MAX_PRICE), name="gpu_price_at_most_max",
                violation_error_message=MAX_PRICE_MESSAGE,
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_type} {self.price_per_gpu_hour}/h from {self.effective_from:%Y-%m-%d}"


class NodeState(models.TextChoices):
    """Health, kept by the agent's heartbeats and the silence sweep; never set by hand."""

    READY = "ready"
    UNKNOWN = "unknown"  # silent for METERING_NODE_UNKNOWN_AFTER_S
    DOWN = "down"  # silent for METERING_NODE_DOWN_AFTER_S: its attempts end as lost


class NodeCordon(models.TextChoices):
    """What an operator decided, kept apart from health so heartbeats never undo it (Slurm's DRAIN
    flag beside a node's state; Kubernetes' cordon beside its Ready condition)."""

    NONE = "", "in service"
    DRAIN = "drain", "drain: no new jobs, running ones finish"
    DOWN = "down", "out of service: running jobs are stopped and requeued elsewhere"


class Node(models.Model):
    """A GPU server run by one agent; all its GPUs are of one type."""

    name = models.CharField(max_length=128, unique=True)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="nodes")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="nodes")
    gpu_count = models.PositiveSmallIntegerField()
    nvlink_domain = models.CharField(max_length=64, blank=True, default="")
    ib_group = models.CharField(max_length=64, blank=True, default="")
    state = models.CharField(max_length=16, choices=NodeState.choices, default=NodeState.DOWN)
    cordon = models.CharField(max_length=8, choices=NodeCordon.choices, blank=True, default="", db_default="")
    # A planned maintenance window (Slurm's maintenance reservation): before it, the node takes only
    # jobs that end (by their max wall) by its start; during it, no new job (as if drained).
    maintenance_from = models.DateTimeField(null=True, blank=True)
    maintenance_until = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The agent's bearer token; only its SHA-256 is stored.
    token_prefix = models.CharField(max_length=16, unique=True, null=True, blank=True)
    token_hash = models.CharField(max_length=64, blank=True, default="")
    agent_version = models.CharField(max_length=32, blank=True, default="")
    registered_at = models.DateTimeField(null=True, blank=True)
    # Heartbeat stamps would flood the history; the token's hash has no business on a page.
    history = HistoricalRecords(excluded_fields=["last_heartbeat_at", "token_hash"])

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(gpu_count__gt=0), name="node_gpu_count_positive"),
            models.CheckConstraint(
                # Both set, or neither: a comparison with a NULL would pass the CHECK.
                condition=Q(maintenance_from__isnull=True, maintenance_until__isnull=True)
                | Q(maintenance_from__isnull=False, maintenance_until__isnull=False,
                    maintenance_until__gt=F("maintenance_from")),
                name="node_maintenance_window_ordered",
                violation_error_message="A maintenance window needs a start and an end after it.",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        super().clean()
        start, end = self.maintenance_from, self.maintenance_until
        if (start is None) != (end is None):
            missing = "maintenance_until" if end is None else "maintenance_from"
            raise ValidationError({missing: "A maintenance window needs both a start and an end."})
        if start is not None and end is not None and end <= start:
            raise ValidationError({"maintenance_until": "The window must end after it starts."})

    @property
    def scheduling_state(self) -> str:
        """The state the scheduler sees: an operator's cordon first, then health."""
        return scheduling_state(self.state, self.cordon)


def in_maintenance(now: Any, maintenance_from: Any, maintenance_until: Any) -> bool:
    """Whether `now` falls inside a node's maintenance window (both ends or neither are set)."""
    return maintenance_from is not None and maintenance_from <= now < maintenance_until


def scheduling_state_at(
    state: str, cordon: str, now: Any, maintenance_from: Any, maintenance_until: Any
) -> str:
    """`scheduling_state` at `now`: a ready node inside its maintenance window takes no new job, so
    the scheduler sees it draining."""
    seen = scheduling_state(state, cordon)
    if seen == "ready" and in_maintenance(now, maintenance_from, maintenance_until):
        return "draining"
    return seen


# Attempts that ran while their job was waiting: since its release (`aging_from`) when it was held,
# so run time before a release is not taken off the wait that began at it (aging, the dashboard).
RAN_SINCE_RELEASE = Q(job__aging_from__isnull=True) | Q(started_at__gte=F("job__aging_from"))


def scheduling_state(state: str, cordon: str) -> str:
    """`ready | draining | unknown | down` for the scheduling core (`core.Node.state`)."""
    if cordon == NodeCordon.DRAIN:
        return "draining" if state == NodeState.READY else state
    if cordon == NodeCordon.DOWN:
        return "down"
    return state


class PriorityClass(models.Model):
    """A priority class, configured as data (higher rank wins)."""

    name = models.SlugField(max_length=32, unique=True)
    rank = models.IntegerField(unique=True)
    # Jobs of this class may be preempted by jobs of a higher class: the default of a job's own
    # `Job.preemptible`, set at submission; the scheduler reads only the job's flag.
    preemptible = models.BooleanField(default=True)
    # Jobs of this class may preempt lower-class preemptible jobs.
    can_preempt = models.BooleanField(default=False)
    # Only organizations granted it (`PriorityGrant`) may submit jobs of this class, as a Slurm
    # association's QOS list: a class that is never preempted and preempts others is not for
    # anyone who asks (QA: any member pinned GPUs and preempted other orgs' jobs with it).
    restricted = models.BooleanField(
        default=False, help_text="Only organizations granted this class may submit jobs of it.")
    history = HistoricalRecords()

    class Meta:
        verbose_name = "priority class"
        verbose_name_plural = "priority classes"

    def __str__(self) -> str:
        return self.name


class PriorityGrant(models.Model):
    """An organization may submit jobs of a restricted priority class."""

    org = models.ForeignKey(Organization, on_delete=models.CASCADE, related_name="priority_grants")
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.CASCADE, related_name="grants")
    granted_at = models.DateTimeField(auto_now_add=True)
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "priority_class"], name="priority_grant_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.org} may use {self.priority_class}"


class Quota(models.Model):
    """A cap on concurrent GPUs of one type for an org (project null) or a project."""

    # PROTECT, as for the GPU type: a quota goes by its own (audited) delete, never silently with
    # its org or project in the admin (review).
    org = models.ForeignKey(Organization, on_delete=models.PROTECT, related_name="quotas")
    project = models.ForeignKey(
        Project, null=True, blank=True, on_delete=models.PROTECT, related_name="quotas"
    )
    # PROTECT, as a type's prices and nodes: deleting a GPU type in the admin removed its quotas
    # silently (no sched.quota.deleted event; review). The admin now refuses, listing them; delete
    # the quotas first (each audited) if the type must go.
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="quotas")
    max_gpus = models.PositiveIntegerField()
    history = HistoricalRecords()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["org", "project", "gpu_type"],
                name="quota_unique",
                nulls_distinct=False,
            ),
        ]

    def __str__(self) -> str:
        return f"quota {self.max_gpus}x{self.gpu_type} for {self.project or self.org}"

    def clean(self) -> None:
        """A project quota must name the project's own org. The scheduler keys project quotas by
        project alone (`adapter.snapshot.load_quotas`), so a quota saved under another org would
        still cap that project, while the admin lists it under the wrong org."""
        super().clean()
        if self.project_id is None or self.org_id is None:
            return
        if self.project.org_id != self.org_id:
            raise ValidationError({"project": (
                f"Project {self.project} belongs to organization {self.project.org}, not {self.org}: "
                "choose a project of this quota's organization, or none for an org-wide quota."
            )})


class JobState(models.TextChoices):
    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    PREEMPTED = "preempted"  # transient: requeued or failed by policy


TERMINAL_JOB_STATES = (
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.CANCELLED,
    JobState.TIMED_OUT,
)


class Dependency(models.TextChoices):
    """When a job with dependencies may start (Slurm's `--dependency`)."""

    AFTER_OK = "afterok"  # every dependency completed; one that ends otherwise cancels this job
    AFTER_ANY = "afterany"  # every dependency ended, however


class Job(models.Model):
    """A training or inference job as submitted; runs as one or more attempts."""

    # Indexed by `job_org_state_idx` (org first): no single-column index of its own.
    org = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="jobs")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=200)
    gpu_types = models.JSONField()  # ordered preference, e.g. ["H100", "A100"]
    gpu_count = models.PositiveIntegerField()
    gpu_memory_gb = models.PositiveIntegerField(default=0)  # floor per GPU
    max_wall_seconds = models.PositiveIntegerField()
    priority_class = models.ForeignKey(PriorityClass, on_delete=models.PROTECT, related_name="+")
    # What the scheduler reads (not the class's flag): set from the class's policy at submission
    # unless the client chose (`submission.validate_spec`).
    preemptible = models.BooleanField(default=True)
    command = models.TextField(blank=True, default="")
    regions = models.JSONField(default=list, blank=True)
    # Indexed by `job_state_idx` (equality only: no `LIKE` pattern index).
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED)
    # Why a queued job waits (scheduler reason code) and a human detail.
    wait_reason = models.CharField(max_length=64, blank=True, default="")
    wait_detail = models.CharField(max_length=DETAIL_MAX_LENGTH, blank=True, default="")
    # When the last pass's reservation (EASY, preemption or quota room) expects it to start, by
    # the max wall times of what runs (Slurm's `squeue --start`); null without one.
    expected_start_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=64, blank=True, default="")
    # Why, in words, when the reason alone does not say (e.g. what refused an out_of_credit run's
    # extension: funds or which budget; QA: only the audit trail said).
    end_detail = models.CharField(max_length=DETAIL_MAX_LENGTH, blank=True, default="", db_default="")
    current_hold = models.ForeignKey(
        "ledger.Hold", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # Micro-credits for the whole max wall time at the price the hold was priced at (the hold
    # itself may cover only the org's hold window); re-priced on requeue and on a dearer placement.
    estimate = models.BigIntegerField(default=0)
    attempt_count = models.PositiveIntegerField(default=0)
    max_retries = models.PositiveIntegerField(default=3)
    not_before = models.DateTimeField(null=True, blank=True)  # retry backoff
    # A job whose new hold was refused is tried again (`lifecycle.fund_waiting_jobs`) from then, or
    # at once when money arrives (`receivers`); apart from `not_before`, so that arriving money
    # never cuts a retry backoff (review).
    funding_retry_at = models.DateTimeField(null=True, blank=True)
    # Until then the scheduler places the job only on types its hold covers without a top-up: one
    # for a dearer type was refused (`adapter/repricing.py`); later, a dearer type is tried again.
    price_capped_until = models.DateTimeField(null=True, blank=True)
    submitted_at = models.DateTimeField(db_index=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Jobs that must end first (earlier jobs of the same org); "" = none. The one-statement
    # submission (`jobs_submit`) never inserts a job with dependencies, hence the database default.
    depends_on = models.ManyToManyField("self", symmetrical=False, related_name="dependents", blank=True)
    dependency = models.CharField(max_length=16, choices=Dependency.choices, blank=True, default="",
                                  db_default="")
    # Held by its user or an admin (Slurm's `scontrol hold`): queued, credits held, never offered to
    # the scheduler until released. Aging counts from `aging_from` (the release, or the end of the
    # last dependency) when later than submission, so holding a job never buys it queue time.
    held = models.BooleanField(default=False, db_default=False)
    # Held by an operator (the admin's Hold action; Slurm's admin hold): only an operator releases
    # it, and its user's own hold or release does not change it. Always False when not held.
    held_by_operator = models.BooleanField(default=False, db_default=False)
    aging_from = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(held=True) | Q(held_by_operator=False),
                                   name="job_operator_hold_is_a_hold"),
            models.CheckConstraint(condition=Q(gpu_count__gt=0), name="job_gpu_count_positive"),
            models.CheckConstraint(
                condition=Q(max_wall_seconds__gt=0), name="job_max_wall_positive"
            ),
        ]
        indexes = [
            models.Index(fields=["org", "state"], name="job_org_state_idx"),
            models.Index(fields=["state"], name="job_state_idx"),
        ]
        # The admin's cancel, hold and release actions (review: they needed only view_job, so
        # staff who may only read the job list could cancel anyone's jobs).
        permissions = [("operate_job", "Can cancel, hold and release jobs in the admin")]

    def __str__(self) -> str:
        return f"job {self.pk} {self.name} ({self.state})"


class AttemptState(models.TextChoices):
    SCHEDULED = "scheduled"  # GPUs allocated, agent not yet started it
    RUNNING = "running"
    STOPPING = "stopping"  # stop requested (preemption, cancel, out of credit), grace running
    ENDED = "ended"


class JobAttempt(models.Model):
    """One run of a job on allocated GPUs, with the rate fixed when it was placed."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="attempts")
    number = models.PositiveIntegerField()
    org_id = models.BigIntegerField(db_index=True)
    state = models.CharField(
        max_length=16, choices=AttemptState.choices, default=AttemptState.SCHEDULED, db_index=True
    )
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="+")
    gpu_count = models.PositiveIntegerField()
    rate_per_gpu_hour = models.BigIntegerField()  # micro-credits, fixed for this attempt
    hold = models.ForeignKey("ledger.Hold", on_delete=models.PROTECT, related_name="+")
    scheduled_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=32, blank=True, default="")
    stop_detail = models.CharField(max_length=DETAIL_MAX_LENGTH, blank=True, default="", db_default="")
    grace_seconds = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=32, blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    # A gang on several nodes ends when its last part does; the first part to exit decides how it
    # ended (docs/metering.md, "Gangs on several nodes").
    node_count = models.PositiveSmallIntegerField(default=1)  # nodes its GPUs are on (a gang: > 1)
    first_part_outcome = models.CharField(max_length=32, blank=True, default="")
    first_part_exit_code = models.IntegerField(null=True, blank=True)
    backfilled = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "number"], name="attempt_number_unique"),
            models.UniqueConstraint(
                fields=["job"],
                condition=~Q(state="ended"),
                name="one_live_attempt_per_job",
                violation_error_message="A job has at most one live attempt.",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.number} ({self.state})"


class Allocation(models.Model):
    """One GPU of a node given to one attempt; the database forbids giving it twice."""

    attempt = models.ForeignKey(JobAttempt, on_delete=models.PROTECT, related_name="allocations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="allocations")
    gpu_index = models.PositiveSmallIntegerField()
    allocated_at = models.DateTimeField()
    # When this node's agent reported its part of the attempt started (a gang's parts start apart).
    started_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["node", "gpu_index"],
                condition=Q(released_at__isnull=True),
                name="gpu_allocated_once",
                violation_error_message="This GPU is already allocated.",
            ),
            models.CheckConstraint(
                condition=Q(released_at__isnull=True) | Q(released_at__gte=F("allocated_at")),
                name="allocation_release_after_start",
            ),
        ]
        # The dashboard's last-hour chart reads allocations live or released in the window.
        indexes = [models.Index(fields=["released_at"], name="alloc_released_idx")]

    def __str__(self) -> str:
        return f"{self.node}:{self.gpu_index} -> attempt {self.attempt_id}"


class SchedulerPass(models.Model):
    """A record of one scheduling pass (for observability and the leader lock's bookkeeping)."""

    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    trigger = models.CharField(max_length=32, default="beat")
    pending = models.PositiveIntegerField(default=0)
    placed = models.PositiveIntegerField(default=0)
    preempted = models.PositiveIntegerField(default=0)
    backfilled = models.PositiveIntegerField(default=0)
    waiting_changed = models.PositiveIntegerField(default=0)  # jobs whose wait reason changed
    conflicts = models.PositiveIntegerField(default=0)  # placements dropped: GPUs taken meanwhile
    load_ms = models.PositiveIntegerField(default=0)
    core_ms = models.PositiveIntegerField(default=0)
    write_ms = models.PositiveIntegerField(default=0)
    total_ms = models.PositiveIntegerField(default=0)

    class Meta:
        verbose_name_plural = "scheduler passes"

    def __str__(self) -> str:
        return f"pass {self.pk} at {self.started_at:%H:%M:%S}"


class JobRefund(models.Model):
    """Credits finance gave back for what a job (or one of its attempts) was charged.

    Written only by `scheduling.services.refunds.refund_job`, with the job row locked, so a job's
    refunds never add up to more than its captures. The credits are the new bucket (source
    `refund`, reference `refund:job:<id>:<key>`); the journal's `refund` transaction moves them."""

    job = models.ForeignKey(Job, on_delete=models.PROTECT, related_name="refunds")
    attempt = models.ForeignKey(JobAttempt, null=True, blank=True, on_delete=models.PROTECT,
                                related_name="refunds")
    org_id = models.BigIntegerField(db_index=True)
    bucket = models.OneToOneField("ledger.Bucket", on_delete=models.PROTECT, related_name="refund")
    amount = models.BigIntegerField()
    reason = models.TextField()
    key = models.CharField(max_length=255)  # the caller's idempotency key, unique per job
    created_at = models.DateTimeField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
                                   related_name="+")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "key"], name="job_refund_key_unique"),
            models.CheckConstraint(condition=Q(amount__gt=0), name="job_refund_amount_positive"),
        ]
        permissions = [("refund_job", "Can credit (refund) what a job was charged")]

    def __str__(self) -> str:
        return f"refund {self.pk} of job {self.job_id} ({self.amount})"
