"""Jobs endpoints: thin views over `submit_job` / `cancel_job` and tenancy-scoped reads."""

import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.selectors import (
    can_submit,
    get_visible_org,
    get_visible_project_for_submit,
    is_finance,
    job_write_refusal,
    org_role,
    require_finance,
    require_org_reader,
    visible_projects,
)
from config import metrics
from config.api.idempotency import key_of, run_idempotent, run_in_one_statement
from config.api.ratelimit import enforce_org_limit, hit, principal_identity, submission_gate
from config.api.serializers import no_query, query_of, validated
from config.clock import db_now
from ledger.selectors import attach_release_split
from scheduling.api.serializers import (
    GpuTypesSerializer,
    JobDetailSerializer,
    JobListQuerySerializer,
    JobPrioritySerializer,
    JobRefundResultSerializer,
    JobRefundSerializer,
    JobSerializer,
    JobSubmitSerializer,
    OrgFairShareSerializer,
    OrgQuotasSerializer,
    PriorityClassesSerializer,
    render_hold_summary,
    render_job_priority,
    render_new_job,
)
from scheduling.class_report import priority_classes_for
from scheduling.fairshare_report import org_fair_share
from scheduling.fleet_report import gpu_types, org_quotas
from scheduling.job_reads import ATTEMPT_DETAIL, job_detail, visible_jobs, with_refunded
from scheduling.models import Job
from scheduling.selectors import job_charged, job_refunded, job_standing
from scheduling.services.holding import hold_job, release_job
from scheduling.services.lifecycle import cancel_job
from scheduling.services.refunds import refund_job
from scheduling.services.submission import JobSpec, submit_job
from scheduling.services.submission_sql import enabled as submission_in_sql
from scheduling.services.submission_sql import submit_job_in_sql

# The submission body's serializer, built once: DRF builds a serializer's fields per instance
# (deep copies), which cost more than validating one body. See `config.api.serializers.validated`.
_JOB_SUBMIT = JobSubmitSerializer()
_JOB_SUBMIT.fields  # noqa: B018 (build the fields now, not racing on first use)


def get_visible_job(user: Any, job_id: int) -> Job:
    job = visible_jobs(user).filter(pk=job_id).first()
    if job is None:
        raise NotFound("No such job.")
    return job


class JobListCreateView(GenericAPIView):
    serializer_class = JobSerializer
    # POST charges its per-key limit together with the org limit and the in-flight slot (one
    # Redis round trip, `submission_gate`); a request refused before that still charges it.
    key_limit_in_view = True

    def get_throttles(self) -> list:
        self.rate_limit_scope = "jobs-submit" if self.request.method == "POST" else "jobs-read"
        return super().get_throttles()

    @extend_schema(
        operation_id="jobs_list",
        parameters=[JobListQuerySerializer],
        responses=JobSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        query = JobListQuerySerializer(data=query_of(request, lists=("state",)))
        query.is_valid(raise_exception=True)
        jobs = visible_jobs(request.user).order_by("-submitted_at", "-id")
        wanted = query.validated_data
        if project := wanted.get("project"):
            jobs = jobs.filter(project_id=project)
        if states := wanted.get("state"):
            jobs = jobs.filter(state__in=sorted(states))
        if user := wanted.get("user"):
            jobs = jobs.filter(user_id=user) if isinstance(user, int) else jobs.filter(user__username=user)
        if name := wanted.get("name"):
            jobs = jobs.filter(name__startswith=name)
        if reason := wanted.get("wait_reason"):
            jobs = jobs.filter(wait_reason=reason)
        if since := wanted.get("submitted_since"):
            jobs = jobs.filter(submitted_at__gte=since)
        if until := wanted.get("submitted_until"):
            jobs = jobs.filter(submitted_at__lt=until)
        page = self.paginate_queryset(jobs)
        attach_release_split(job.current_hold for job in page)  # one query for the page, not per job
        return self.get_paginated_response(JobSerializer(page, many=True).data)

    @extend_schema(
        operation_id="jobs_submit",
        request=JobSubmitSerializer,
        responses={201: JobDetailSerializer},
        description="Validate, price and hold credits for a job, and queue it — one transaction.",
    )
    def post(self, request: Request) -> Response:
        try:
            key = key_of(request)
            data = validated(_JOB_SUBMIT, request.data)
            project = get_visible_project_for_submit(request.user, data["project"])
        except Exception:
            # As if the throttle had charged the key first: over the limit answers 429.
            hit(scope="jobs-submit", kind="key", identity=principal_identity(request))
            raise
        spec = JobSpec(
            name=data["name"], gpu_types=tuple(data["gpu_types"]), gpu_count=data["gpu_count"],
            gpu_memory_gb=data["gpu_memory_gb"], max_wall_seconds=data["max_wall_seconds"],
            priority_class=data["priority_class"], preemptible=data.get("preemptible"),
            command=data["command"], regions=tuple(data["regions"]), depends_on=tuple(data["depends_on"]),
            dependency=data["dependency"], held=data["held"],
        )

        body: dict[str, Any] = {}

        def render(job: Job) -> None:
            # Rendered before the org's budget and bucket rows are locked; only the hold's
            # summary is added once it exists (nothing else about the job changes after this).
            body.update(render_new_job(job))

        # The job's hold pointer is written with the idempotency record's completion (one round
        # trip, same transaction).
        deferred: list[tuple[str, list[Any]]] = []

        def effect(now: datetime) -> tuple[int, Any]:
            job = submit_job(user=request.user, project=project, spec=spec, idempotency_key=key,
                             on_inserted=render, deferred_writes=deferred, now=now)
            body["hold"] = render_hold_summary(job.current_hold)
            return 201, body

        def in_one_statement(principal: str, key: str, fingerprint: str) -> tuple[int, int, Any] | None:
            done = submit_job_in_sql(user=request.user, project=project, spec=spec, idempotency_key=key,
                                     principal=principal, fingerprint=fingerprint)
            if done is None:
                return None
            return done.record_id, 201, {**render_new_job(done.job), "hold": render_hold_summary(done.hold)}

        with submission_gate(request, org_id=project.org_id, cap=project.org.max_inflight_submissions,
                             scope="jobs-submit"):
            # PostgreSQL: a submission that will be accepted is one statement (ADR 0006); any
            # other outcome is decided by the Python path below, which it leaves untouched.
            if not submission_in_sql():
                metrics.submission_path("python")
            elif fast := run_in_one_statement(request, in_one_statement):
                metrics.submission_path("one_statement")
                return fast
            else:
                metrics.submission_path("declined")
            return run_idempotent(request, effect, deferred_writes=deferred, pass_now=True)


class JobDetailView(GenericAPIView):
    serializer_class = JobDetailSerializer
    rate_limit_scope = "jobs-read"

    @extend_schema(operation_id="jobs_retrieve", responses=JobDetailSerializer)
    def get(self, request: Request, job_id: int) -> Response:
        no_query(request)
        job = job_detail(request.user, job_id, visible_jobs(request.user))
        if job is None:
            raise NotFound("No such job.")
        return Response(JobDetailSerializer(job).data)


class JobPriorityView(GenericAPIView):
    serializer_class = JobPrioritySerializer
    rate_limit_scope = "jobs-read"

    @extend_schema(
        operation_id="jobs_priority", responses=JobPrioritySerializer,
        description="A queued job's place in the queue and its priority term by term (class, fair "
        "share with the org/project/user levels behind it, size, age), as the next scheduling pass "
        "orders it. 409 `job-not-queued` for a job in any other state.",
    )
    def get(self, request: Request, job_id: int) -> Response:
        no_query(request)
        job = get_visible_job(request.user, job_id)
        return Response(render_job_priority(job_standing(job)))


class OrgFairShareView(GenericAPIView):
    serializer_class = OrgFairShareSerializer
    rate_limit_scope = "jobs-read"

    @extend_schema(
        operation_id="orgs_fair_share", responses=OrgFairShareSerializer,
        description="The org's fair-share tree as the scheduler ranks it: the org among the orgs "
        "with work, its projects and their members, each with weight, share and decayed usage among "
        "its siblings, level fair share, and the fair-share factor of users with a job the pass is "
        "offered (queued, not held, past any backoff, dependencies met) or one placed or running "
        "(Slurm's sshare -l). Org members and finance.",
    )
    def get(self, request: Request, org_id: int) -> Response:
        no_query(request)
        org = get_visible_org(request.user, org_id)
        require_org_reader(request.user, org, "its fair-share tree")
        return Response(OrgFairShareSerializer(org_fair_share(org)).data)


class GpuTypesView(GenericAPIView):
    serializer_class = GpuTypesSerializer
    rate_limit_scope = "jobs-read"

    @extend_schema(
        operation_id="gpu_types", responses=GpuTypesSerializer,
        description="The GPU types on offer: memory, price per GPU-hour now and the next scheduled "
        "price, regions, nodes by state, and GPUs ready, in use and free now, with the largest gang "
        "free on one node (Slurm's sinfo). Any signed-in caller.",
    )
    def get(self, request: Request) -> Response:
        no_query(request)
        return Response(GpuTypesSerializer({"computed_at": db_now(), "gpu_types": gpu_types()}).data)


class PriorityClassesView(GenericAPIView):
    serializer_class = PriorityClassesSerializer
    rate_limit_scope = "jobs-read"

    @extend_schema(
        operation_id="priority_classes", responses=PriorityClassesSerializer,
        description="The priority classes, highest first, and which of your organizations may submit "
        "jobs of each (a restricted class only those granted it; Slurm's QOS list of an association). "
        "Any signed-in caller.",
    )
    def get(self, request: Request) -> Response:
        no_query(request)
        classes = priority_classes_for(request.user)
        return Response(PriorityClassesSerializer({"priority_classes": classes}).data)


class OrgQuotasView(GenericAPIView):
    serializer_class = OrgQuotasSerializer
    rate_limit_scope = "jobs-read"

    @extend_schema(
        operation_id="orgs_quotas", responses=OrgQuotasSerializer,
        description="The org's concurrent-GPU quotas, org-wide and per project, each with the GPUs its "
        "jobs hold now, what is left, and the queued jobs that could run on the type (Kueue's "
        "ClusterQueue status). Org members and finance see every quota; a project-only member sees "
        "the org-wide ones and those of the projects they belong to.",
    )
    def get(self, request: Request, org_id: int) -> Response:
        no_query(request)
        org = get_visible_org(request.user, org_id)
        org_wide = is_finance(request.user) or org_role(request.user, org.pk) is not None
        projects = None if org_wide else set(
            visible_projects(request.user).filter(org=org).values_list("id", flat=True)
        )
        body = {"org": org.pk, "computed_at": db_now(), "quotas": org_quotas(org, projects)}
        return Response(OrgQuotasSerializer(body).data)


class _JobActionView(GenericAPIView):
    """POST /jobs/{id}/<action>: no body, Idempotency-Key, a project member (not a viewer) or an
    org owner/admin; answers with the job."""

    serializer_class = JobDetailSerializer
    rate_limit_scope = "jobs-submit"
    verb: str  # "cancel", "hold", ...: the 400 and 403 messages say it
    change: Callable[..., Job]  # the lifecycle service, called as change(job=..., actor=...)

    def post(self, request: Request, job_id: int) -> Response:
        key_of(request)
        if request.data:
            raise ValidationError({"non_field_errors": [f"{self.verb.capitalize()} takes no body."]})
        job = get_visible_job(request.user, job_id)
        if not can_submit(request.user, job.project):
            raise PermissionDenied(job_write_refusal(request.user, job.project, self.verb))
        enforce_org_limit(request, org_id=job.org_id, scope="jobs-submit")

        def effect() -> tuple[int, Any]:
            self.change(job=job, actor=request.user)
            fresh = with_refunded(visible_jobs(request.user)).prefetch_related(*ATTEMPT_DETAIL).get(pk=job.pk)
            return 200, JobDetailSerializer(fresh).data

        return run_idempotent(request, effect)


@extend_schema_view(post=extend_schema(
    operation_id="jobs_cancel", request=None, responses=JobDetailSerializer,
    description="Cancel a job (idempotent). A queued job's hold is released at once; a "
    "running one is stopped and becomes cancelled when its agent reports the exit.",
))
class JobCancelView(_JobActionView):
    verb = "cancel"
    change = staticmethod(cancel_job)


@extend_schema_view(post=extend_schema(
    operation_id="jobs_hold", request=None, responses=JobDetailSerializer,
    description="Keep a queued job from being scheduled until it is released (Slurm's scontrol "
    "hold); its credits stay held. Idempotent; 409 `illegal-job-transition` unless queued.",
))
class JobHoldView(_JobActionView):
    verb = "hold"
    change = staticmethod(hold_job)


@extend_schema_view(post=extend_schema(
    operation_id="jobs_release", request=None, responses=JobDetailSerializer,
    description="Let a held job be scheduled again; its aging restarts now, so holding a job "
    "never buys it queue time. Releasing a job that is not held changes nothing; a job an operator "
    "held (`held_by_operator`) is 403 `held-by-operator`: only an operator releases it.",
))
class JobReleaseView(_JobActionView):
    verb = "release"
    change = staticmethod(release_job)


def _refund_key(user_id: int, key: str) -> str:
    """The caller's key for `refund_job` (at most 255 characters: a long one is hashed; QA: a
    254-character Idempotency-Key was refused once the user id was put before it)."""
    scoped = f"{user_id}:{key}"
    return scoped if len(scoped) <= 255 else f"{user_id}:sha256:{hashlib.sha256(key.encode()).hexdigest()}"


class JobRefundView(GenericAPIView):
    serializer_class = JobRefundResultSerializer
    rate_limit_scope = "finance"

    @extend_schema(
        operation_id="jobs_refund", request=JobRefundSerializer,
        responses={201: JobRefundResultSerializer, 200: JobRefundResultSerializer},
        description="Finance only: credit (refund) up to what the job, or one of its attempts, was "
        "charged (its captures) less what was refunded for it, as new paid credits of the org (a bucket "
        "of source `refund`, reference `refund:job:<id>:<user id>:<Idempotency-Key>`). 409 "
        "`refund-exceeds-charges` past that. The same request again (same user and key) answers 201 "
        "with `Idempotent-Replayed: true` while the key is kept, 200 with the same refund after.",
    )
    def post(self, request: Request, job_id: int) -> Response:
        key = key_of(request)
        require_finance(request.user)
        job = get_visible_job(request.user, job_id)
        body = JobRefundSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data

        def effect() -> tuple[int, Any]:
            # Keys are the caller's (DESIGN §7): two finance users' same key are two refunds (review).
            refund = refund_job(job_id=job.pk, amount=data["amount"], reason=data["reason"],
                                key=_refund_key(request.user.pk, key),
                                attempt_number=data.get("attempt"), expires_at=data.get("expires_at"),
                                actor=request.user)
            refund.job_charged = job_charged(job.pk)
            refund.job_refunded = job_refunded(job.pk)
            return (200 if refund.replayed else 201), JobRefundResultSerializer(refund).data

        return run_idempotent(request, effect)
