"""Job submission input (strict) and job output shapes."""

import re
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from config.api.serializers import (
    MAX_AMOUNT,
    AwareDateTimeField,
    QueryDigitsField,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictQuerySerializer,
    StrictSerializer,
)
from ledger.models import Hold
from ledger.selectors import release_split
from scheduling.core import reasons as core_reasons
from scheduling.models import Dependency, Job, JobAttempt, JobState
from scheduling.services.dependencies import MAX_DEPENDENCIES

MAX_GPU_COUNT = 1024
MAX_GPU_TYPES = 8  # acceptable types per job; the schema states this limit whatever the fleet holds
MAX_WALL_SECONDS = 30 * 24 * 3600
MAX_GPU_MEMORY_GB = 4096


class JobSubmitSerializer(StrictSerializer):
    project = StrictIntegerField(min_value=1, max_value=2**53)
    name = StrictCharField(min_length=1, max_length=200)
    gpu_types = serializers.ListField(
        child=StrictCharField(min_length=1, max_length=32), min_length=1, max_length=MAX_GPU_TYPES,
        help_text="Acceptable GPU types in order of preference, e.g. [\"H100\", \"A100\"].",
    )
    gpu_count = StrictIntegerField(min_value=1, max_value=MAX_GPU_COUNT)
    gpu_memory_gb = StrictIntegerField(min_value=0, max_value=MAX_GPU_MEMORY_GB, default=0,
                                       help_text="Per-GPU memory floor.")
    max_wall_seconds = StrictIntegerField(min_value=1, max_value=MAX_WALL_SECONDS)
    priority_class = StrictCharField(min_length=1, max_length=32)
    preemptible = StrictBooleanField(
        required=False,
        help_text="Defaults to the priority class's policy; false only for non-preemptible classes.",
    )
    command = StrictCharField(required=False, allow_blank=True, max_length=4096, default="")
    regions = serializers.ListField(
        child=StrictCharField(min_length=1, max_length=32), required=False, max_length=16, default=list
    )
    depends_on = serializers.ListField(
        child=StrictIntegerField(min_value=1, max_value=2**53), required=False, max_length=MAX_DEPENDENCIES,
        default=list,
        help_text="Earlier jobs of the same organization that must end before this one may start.",
    )
    held = StrictBooleanField(
        required=False, default=False,
        help_text="Submit held (Slurm's --hold): queued with its credits held, never scheduled until "
        "POST /jobs/{id}/release.",
    )
    dependency = serializers.ChoiceField(
        choices=Dependency.choices, required=False, allow_null=True, default=None,
        help_text="afterok (the default; also null): every dependency must complete (one that fails, "
        "is cancelled or times out cancels this job); afterany: every dependency must end, however. "
        "Only with depends_on.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """`dependency` says how `depends_on` must end, so it needs `depends_on` (null = afterok)."""
        if attrs.get("dependency") is not None and not attrs.get("depends_on"):
            raise serializers.ValidationError(
                {"dependency": ["Only with depends_on (the jobs to wait for)."]}
            )
        attrs["dependency"] = attrs.get("dependency") or Dependency.AFTER_OK
        return attrs


class HoldSummarySerializer(serializers.ModelSerializer):
    """authorized = captured + released + expired + remaining (micro-credits)."""

    released = serializers.SerializerMethodField(
        help_text="Given back to the org: returned to the available credits of the buckets it came from."
    )
    expired = serializers.SerializerMethodField(
        help_text="Released after its bucket had expired, so it went to expiry: the org did not get it back."
    )
    remaining = serializers.IntegerField(read_only=True)
    gpu_types = serializers.ListField(  # typed: the model's JSONField would be any JSON (review)
        child=serializers.CharField(), read_only=True,
        help_text=("The GPU types the hold pays for: the job runs only on those of its types (fewer than "
                   "it accepts when its org's credits are restricted to some GPU types)."),
    )

    class Meta:
        model = Hold
        fields = ["id", "state", "authorized", "captured", "released", "expired", "remaining",
                  "gpu_types", "created_at", "settled_at"]

    def get_released(self, hold: Hold) -> int:
        return release_split(hold)[0]

    def get_expired(self, hold: Hold) -> int:
        return release_split(hold)[1]


class AttemptSerializer(serializers.ModelSerializer):
    gpu_type = serializers.CharField(source="gpu_type.name", read_only=True)
    nodes = serializers.SerializerMethodField()
    charged = serializers.IntegerField(source="hold.captured", read_only=True,
                                       help_text="Micro-credits captured for this attempt so far.")

    class Meta:
        model = JobAttempt
        fields = ["number", "state", "gpu_type", "gpu_count", "nodes", "rate_per_gpu_hour", "charged",
                  "scheduled_at", "started_at", "ended_at", "stop_reason", "stop_detail", "outcome",
                  "exit_code", "backfilled"]

    def get_nodes(self, attempt: JobAttempt) -> list[str]:
        """The nodes its GPUs were on."""
        return sorted({a.node.name for a in attempt.allocations.all()})


class JobSerializer(serializers.ModelSerializer):
    priority_class = serializers.CharField(source="priority_class.name", read_only=True)
    project = serializers.IntegerField(source="project_id", read_only=True)
    org = serializers.IntegerField(source="org_id", read_only=True)
    user = serializers.IntegerField(source="user_id", read_only=True)
    hold = HoldSummarySerializer(source="current_hold", read_only=True, allow_null=True)
    depends_on = serializers.PrimaryKeyRelatedField(many=True, read_only=True)
    dependency = serializers.SerializerMethodField()
    expected_start_at = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = ["id", "org", "project", "user", "name", "state", "gpu_types", "gpu_count",
                  "gpu_memory_gb", "max_wall_seconds", "priority_class", "preemptible", "command",
                  "regions", "depends_on", "dependency", "held", "held_by_operator", "wait_reason",
                  "wait_detail", "expected_start_at", "end_reason", "end_detail", "estimate", "hold",
                  "attempt_count", "max_retries", "submitted_at", "updated_at", "finished_at"]
        read_only_fields = fields

    def get_dependency(self, job: Job) -> str | None:
        """`afterok` / `afterany`; null for a job without dependencies."""
        return job.dependency or None

    # Nullable: most jobs have none (schemathesis: a 201 with null failed the schema's bare date-time).
    @extend_schema_field({"type": "string", "format": "date-time", "nullable": True})
    def get_expected_start_at(self, job: Job) -> str | None:
        """A waiting job's expected start (Slurm's `squeue --start`): when the last scheduling pass's
        reservation for it (GPUs, or room under its quota) begins, by the max wall times of what
        runs; jobs often end sooner, so it is a latest estimate, not a promise. Null without one,
        and for a job not waiting (or held)."""
        if job.state != JobState.QUEUED or job.held or job.expected_start_at is None:
            return None
        return _when(job.expected_start_at)


class JobDetailSerializer(JobSerializer):
    attempts = AttemptSerializer(many=True, read_only=True)
    refunded = serializers.SerializerMethodField()

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "refunded", "attempts"]
        read_only_fields = fields

    def get_refunded(self, job: Job) -> int:
        """Micro-credits finance refunded for this job's charges (POST /jobs/{id}/refund); its
        attempts' `charged` less this is what the job cost the org."""
        total = getattr(job, "refunded_total", None)  # annotated by the views (`with_refunded`)
        if total is None:
            total = sum(job.refunds.values_list("amount", flat=True))
        return int(total)


class JobRefundSerializer(StrictSerializer):
    amount = StrictIntegerField(min_value=1, max_value=MAX_AMOUNT, help_text="Micro-credits, at most what "
                                "the job (or the attempt) was charged less what was refunded for it.")
    reason = StrictCharField(min_length=1, max_length=2000)
    attempt = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=2**31,
                                 help_text="Refund one attempt's charges (its number); absent: the job's.")
    expires_at = AwareDateTimeField(required=False, allow_null=True,
                                    help_text="With its UTC offset, in the future; absent: never expires.")


class JobRefundResultSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.IntegerField(source="job_id")
    attempt = serializers.SerializerMethodField()
    amount = serializers.IntegerField()
    reason = serializers.CharField()
    bucket = serializers.IntegerField(source="bucket_id", help_text="The new bucket (source `refund`).")
    reference = serializers.CharField(source="bucket.reference")
    created_at = serializers.DateTimeField()
    job_charged = serializers.IntegerField(help_text="What the job was charged (its attempts' captures).")
    job_refunded = serializers.IntegerField(help_text="Refunded for the job so far, this refund included.")

    def get_attempt(self, refund: Any) -> int | None:
        return refund.attempt.number if refund.attempt_id else None


# `reserved-for-job-N` names a job id as the scheduler writes it: 1 or more, without leading zeros
# (review: `reserved-for-job-0` and `reserved-for-job-007` listed nothing, silently, while a 19-digit
# id was a 400; no job is 0, and the stored reason of job 7 is `reserved-for-job-7`).
WAIT_REASON_PATTERN = (
    rf"^(?:{'|'.join(sorted(core_reasons.WAIT_REASONS))}|{core_reasons.RESERVED_PREFIX}[1-9][0-9]{{0,17}})\Z"
)


MAX_USER_ID = 2**53
USERNAME_MAX_LENGTH = 150  # django.contrib.auth's User.username


@extend_schema_field({"anyOf": [
    {"type": "integer", "minimum": 1, "maximum": MAX_USER_ID},
    # A username: anything with a character besides digits (digits alone are an id).
    {"type": "string", "minLength": 1, "maxLength": USERNAME_MAX_LENGTH,
     "pattern": "^[^\\u0000]*[^0-9\\u0000][^\\u0000]*$"},
]})
class UserRefField(serializers.Field):
    """A user id, or a username as Slurm's `sacct -u` takes them: a value of digits only is an id
    (1 to 2^53; as before, `user=0` is a 400), anything else a username (1 to 150 characters, no NUL).
    Gives an int or a str. An unknown id or username is no error: no visible job has it."""

    _id = serializers.IntegerField(min_value=1, max_value=MAX_USER_ID)
    _username = serializers.CharField(min_length=1, max_length=USERNAME_MAX_LENGTH, trim_whitespace=False)

    def to_internal_value(self, data: Any) -> int | str:
        if isinstance(data, str) and not re.fullmatch(r"[0-9]+", data.strip()):
            return self._username.run_validation(data)
        return self._id.run_validation(data)

    def to_representation(self, value: Any) -> Any:
        return value


class JobListQuerySerializer(StrictQuerySerializer):
    """Filters of the job list, as Slurm's `sacct` offers them (all optional, combined with AND)."""

    project = serializers.IntegerField(required=False, min_value=1, max_value=2**53)
    state = serializers.MultipleChoiceField(
        required=False, allow_empty=False, choices=Job._meta.get_field("state").choices,
        help_text="One state or several, comma-separated (e.g. queued,running).",
    )
    user = UserRefField(required=False, help_text="Jobs of this user, by id or username (digits only: an "
                        "id); an unknown one matches no job. Org owners and admins see every member's.")
    name = serializers.CharField(required=False, min_length=1, max_length=128,
                                 help_text="Jobs whose name starts with this.")
    wait_reason = serializers.RegexField(
        WAIT_REASON_PATTERN, required=False, help_text="Queued jobs waiting for this reason (quota, ...).",
        error_messages={"invalid": f"Not a wait reason: one of {', '.join(sorted(core_reasons.WAIT_REASONS))}"
                                   ", or reserved-for-job-N with N a job id (1 or more, up to 18 digits, "
                                   "no leading zero)."},
    )
    submitted_since = AwareDateTimeField(required=False, help_text="Submitted at or after (with its offset).")
    submitted_until = AwareDateTimeField(required=False, help_text="Submitted before (with its offset).")
    page = QueryDigitsField(required=False, min_value=1, max_value=10**6)
    page_size = QueryDigitsField(required=False, min_value=1, max_value=200)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("state"), str) and data["state"]:
            states = data["state"].split(",")
            if "" in states:
                # QA: `queued,,running` (or `queued,`, `state=queued&state=`) dropped the empty item
                # silently while `state=` alone is a 400: a slip is never ignored.
                raise serializers.ValidationError({"state": [
                    "An empty state in the list: give states separated by single commas, e.g. queued,running."
                ]})
            data = {**data, "state": states}
        return super().to_internal_value(data)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """A window that ends before it starts is a mistake, not an empty list (as on the journal)."""
        since, until = attrs.get("submitted_since"), attrs.get("submitted_until")
        if since and until and until < since:
            raise serializers.ValidationError({"submitted_until": ["Must not be before submitted_since."]})
        return attrs


_DATETIME = serializers.DateTimeField(read_only=True)


def _when(value: Any) -> Any:
    return _DATETIME.to_representation(value) if value else None


def render_hold_summary(hold: Hold) -> dict[str, Any]:
    """`HoldSummarySerializer(hold).data`, written out (the submission path renders it per request;
    tests/api/test_jobs_submit.py checks it stays equal to the serializer)."""
    returned, expired = release_split(hold)
    return {
        "id": hold.pk, "state": str(hold.state), "authorized": int(hold.authorized),
        "captured": int(hold.captured), "released": returned, "expired": expired,
        "remaining": int(hold.remaining), "gpu_types": list(hold.gpu_types),
        "created_at": _when(hold.created_at),
        "settled_at": _when(hold.settled_at),
    }


def render_new_job(job: Job) -> dict[str, Any]:
    """`JobDetailSerializer(job).data` for a job `submit_job` just inserted (no attempts; `hold`
    is None until its hold exists), written out: DRF's generic field machinery costs more than
    the rest of the submission's Python. Checked equal to the serializer in the API tests."""
    return {
        "id": job.pk, "org": job.org_id, "project": job.project_id, "user": job.user_id,
        "name": str(job.name), "state": str(job.state), "gpu_types": job.gpu_types,
        "gpu_count": int(job.gpu_count), "gpu_memory_gb": int(job.gpu_memory_gb),
        "max_wall_seconds": int(job.max_wall_seconds), "priority_class": str(job.priority_class.name),
        "preemptible": bool(job.preemptible), "command": str(job.command), "regions": job.regions,
        "depends_on": [other.pk for other in job._prefetched_objects_cache["depends_on"]],
        "dependency": str(job.dependency) or None, "held": bool(job.held),
        "held_by_operator": bool(job.held_by_operator),
        "wait_reason": str(job.wait_reason), "wait_detail": str(job.wait_detail),
        "expected_start_at": None, "end_reason": str(job.end_reason), "end_detail": str(job.end_detail),
        "estimate": int(job.estimate),
        "hold": None,
        "attempt_count": int(job.attempt_count), "max_retries": int(job.max_retries),
        "submitted_at": _when(job.submitted_at),
        "updated_at": _when(job.updated_at), "finished_at": _when(job.finished_at), "refunded": 0,
        "attempts": [],
    }


class LevelSerializer(serializers.Serializer):
    share = serializers.FloatField(help_text="Its share among its siblings (weights normalised to 1).")
    usage = serializers.FloatField(help_text="Its part of the siblings' decayed GPU usage (0 to 1).")
    level_fair_share = serializers.FloatField(
        allow_null=True, help_text="share / usage; null when it used nothing (infinitely under-served)."
    )


class FairSharePathSerializer(serializers.Serializer):
    factor = serializers.FloatField(help_text="Fair-share factor in (0, 1]; 1 = most under-served.")
    org = LevelSerializer()
    project = LevelSerializer()
    user = LevelSerializer()


class PriorityTermsSerializer(serializers.Serializer):
    priority_class = serializers.FloatField(help_text="The class's rank.")
    fair_share = serializers.FloatField(help_text="Fair-share weight x factor.")
    size = serializers.FloatField(help_text="Size weight x size factor (short requests score higher).")
    age = serializers.FloatField(help_text="Time waited beyond the aging grace, in class steps.")
    response_ratio = serializers.FloatField(help_text="0 unless response-ratio aging is configured.")


class JobPrioritySerializer(serializers.Serializer):
    """A queued job's place in the queue and what its priority is made of (Slurm's sprio/sshare)."""

    job = serializers.IntegerField()
    computed_at = serializers.DateTimeField(help_text="When the queue was ordered (cached a few seconds).")
    position = serializers.IntegerField(
        allow_null=True,
        help_text="1 = the first job the next pass considers; null while the pass does not consider "
        "it (a retry backoff, or dependencies not met). Jobs further back may still start first, by "
        "backfill or on other GPU types.",
    )
    queue_length = serializers.IntegerField(help_text="Jobs the next pass considers.")
    not_before = serializers.DateTimeField(allow_null=True, help_text="End of a retry backoff, if any.")
    funding_retry_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When a job whose hold was refused is tried again (sooner if money arrives).")
    price_capped_until = serializers.DateTimeField(
        allow_null=True,
        help_text="A job whose hold could not be topped up for a dearer GPU type's price (it waits "
        "`budget`) stays in the queue but is placed only on the types its hold covers until then "
        "(sooner if money arrives); null otherwise.")
    priority = serializers.FloatField(allow_null=True, help_text="In class steps; the sum of `terms`.")
    priority_class = serializers.CharField()
    terms = PriorityTermsSerializer(allow_null=True)
    fair_share = FairSharePathSerializer(allow_null=True)
    wall_seconds = serializers.FloatField(allow_null=True, help_text="The wall the size term reads.")
    waited_seconds = serializers.FloatField(allow_null=True, help_text="What aging counts (runs excluded).")
    wait_reason = serializers.CharField()
    wait_detail = serializers.CharField()


def _level(level: Any) -> dict[str, Any]:
    fair = level.fair_share
    return {"share": level.share, "usage": level.usage,
            "level_fair_share": None if fair == float("inf") else fair}


def _future(moment: Any) -> Any:
    return moment if moment is not None and moment > timezone.now() else None


def render_job_priority(found: Any) -> dict[str, Any]:
    """`JobPrioritySerializer` data for a `scheduling.selectors.JobStanding`."""
    job, standing = found.job, found.standing
    body: dict[str, Any] = {
        "job": job.pk, "computed_at": found.computed_at, "position": None,
        "queue_length": found.queue_length, "not_before": job.not_before,
        "funding_retry_at": job.funding_retry_at, "price_capped_until": _future(job.price_capped_until),
        "priority": None,
        "priority_class": job.priority_class.name, "terms": None, "fair_share": None,
        "wall_seconds": None, "waited_seconds": None, "wait_reason": job.wait_reason,
        "wait_detail": job.wait_detail,
    }
    if standing is not None:
        terms = standing.terms
        org, project, user = standing.levels
        body.update(
            position=standing.position, priority=standing.priority,
            terms={"priority_class": terms.class_rank, "fair_share": terms.fair_share, "size": terms.size,
                   "age": terms.age, "response_ratio": terms.response_ratio},
            fair_share={"factor": standing.fair_share_factor, "org": _level(org),
                        "project": _level(project), "user": _level(user)},
            wall_seconds=standing.wall_seconds, waited_seconds=standing.waited_seconds,
        )
    return JobPrioritySerializer(body).data


class ShareLevelSerializer(serializers.Serializer):
    weight = serializers.FloatField(help_text="Its fair-share weight (1 unless set).")
    share = serializers.FloatField(help_text="Its weight over its siblings' total.")
    usage = serializers.FloatField(help_text="Its part of its siblings' decayed usage (0 to 1).")
    usage_gpu_hours = serializers.FloatField(help_text="Its decayed usage, GPU-hours.")
    level_fair_share = serializers.FloatField(allow_null=True, help_text="share / usage; null: used nothing.")


class ShareUserSerializer(ShareLevelSerializer):
    id = serializers.IntegerField()
    username = serializers.CharField()
    fair_share_factor = serializers.FloatField(
        allow_null=True, help_text="In (0, 1], 1 = most under-served; null without queued or running jobs."
    )


class ShareProjectSerializer(ShareLevelSerializer):
    id = serializers.IntegerField()
    slug = serializers.CharField()
    users = ShareUserSerializer(many=True)


class OrgFairShareSerializer(ShareLevelSerializer):
    """An org's fair-share tree as the scheduler ranks it (Slurm's sshare -l)."""

    org = serializers.IntegerField()
    computed_at = serializers.DateTimeField()
    half_life_seconds = serializers.FloatField()
    projects = ShareProjectSerializer(many=True)


class NextPriceSerializer(serializers.Serializer):
    price_per_gpu_hour = serializers.IntegerField(help_text="Micro-credits per GPU-hour.")
    effective_from = serializers.DateTimeField()


class NodeCountsSerializer(serializers.Serializer):
    ready = serializers.IntegerField()
    draining = serializers.IntegerField()
    unknown = serializers.IntegerField()
    down = serializers.IntegerField()


class GpuTypeSerializer(serializers.Serializer):
    """A GPU type on offer, its price and its capacity now (Slurm's sinfo)."""

    name = serializers.CharField()
    memory_gb = serializers.IntegerField(help_text="Memory per GPU.")
    price_per_gpu_hour = serializers.IntegerField(
        allow_null=True,
        help_text="Micro-credits per GPU-hour now; a job's run keeps the price it was placed at.",
    )
    price_effective_from = serializers.DateTimeField(allow_null=True)
    next_price = NextPriceSerializer(allow_null=True, help_text="The next scheduled price, if any.")
    regions = serializers.ListField(child=serializers.CharField())
    nodes = NodeCountsSerializer(help_text="Nodes by the state the scheduler sees (a cordon first).")
    gpus = serializers.IntegerField(help_text="GPUs of every node of the type.")
    ready_gpus = serializers.IntegerField(help_text="GPUs of ready nodes: what the scheduler places on.")
    in_use_gpus = serializers.IntegerField(help_text="GPUs allocated to jobs now, on any node.")
    free_gpus = serializers.IntegerField(help_text="GPUs of ready nodes not allocated now.")
    largest_free_on_one_node = serializers.IntegerField(
        help_text="The largest gang that fits one ready node now (bigger gangs span an IB group)."
    )


class GpuTypesSerializer(serializers.Serializer):
    computed_at = serializers.DateTimeField()
    gpu_types = GpuTypeSerializer(many=True)


class PriorityClassSerializer(serializers.Serializer):
    name = serializers.CharField()
    rank = serializers.IntegerField(help_text="Higher runs first; a class is one step of priority.")
    preemptible = serializers.BooleanField(
        help_text="The default of a job's `preemptible` (a job of a preemptible class may not opt out).")
    can_preempt = serializers.BooleanField(help_text="Its jobs may preempt lower-class preemptible jobs.")
    restricted = serializers.BooleanField(help_text="Only organizations granted it may submit jobs of it.")
    your_orgs = serializers.ListField(
        child=serializers.IntegerField(),
        help_text="The organizations you belong to whose jobs may use it (all of them unless restricted).")


class PriorityClassesSerializer(serializers.Serializer):
    priority_classes = PriorityClassSerializer(many=True)


class QuotaStatusSerializer(serializers.Serializer):
    """A concurrent-GPU quota and its use now (Kueue's ClusterQueue status)."""

    gpu_type = serializers.CharField()
    project = serializers.IntegerField(allow_null=True, help_text="null: the quota covers the whole org.")
    project_slug = serializers.CharField(allow_null=True)
    max_gpus = serializers.IntegerField(help_text="GPUs of the type its jobs may hold at once.")
    in_use_gpus = serializers.IntegerField(help_text="GPUs its placed and running jobs hold now.")
    available_gpus = serializers.IntegerField(help_text="max_gpus - in_use_gpus, at least 0.")
    queued_jobs = serializers.IntegerField(help_text="Its queued jobs that could run on the type.")
    queued_gpus = serializers.IntegerField(help_text="The GPUs those jobs ask for.")


class OrgQuotasSerializer(serializers.Serializer):
    org = serializers.IntegerField()
    computed_at = serializers.DateTimeField()
    quotas = QuotaStatusSerializer(many=True)
