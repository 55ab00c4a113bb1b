"""Admin for the fleet (GPU types and prices, nodes, priority classes, quotas) and, read-only, for
jobs, attempts, allocations and scheduler passes. Writes that matter go through services: node tokens
(`issue_node_token`) and cancellation (`cancel_job`); configuration edits are kept by simple-history
and audited (config.audited_admin)."""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone

from config.audited_admin import AuditedSettingAdmin, audit_setting
from config.errors import DomainError
from config.readonly_admin import ReadOnlyAdminMixin
from ledger.errors import InvalidExpiry
from ledger.money import format_credits
from scheduling.models import (
    Allocation,
    GpuPrice,
    GpuType,
    Job,
    JobAttempt,
    JobRefund,
    JobState,
    Node,
    NodeCordon,
    PriorityClass,
    PriorityGrant,
    Quota,
    SchedulerPass,
)


def _price_not_yet_in_effect(price: GpuPrice | None) -> bool:
    """Prices are history: one that is (or was) in effect priced holds and runs, so it can never
    be changed or deleted (add a new one instead). A price scheduled for later may be corrected."""
    return price is not None and price.effective_from > timezone.now()


class GpuPriceForm(forms.ModelForm):
    """A price takes effect when it is saved or later: a back-dated one would rewrite history (the
    catalog would claim it applied while holds and runs were priced otherwise), and editing a
    scheduled price into the past would change the price in effect. A time up to a minute ago
    (typed "now") is taken as now."""

    class Meta:
        model = GpuPrice
        fields = ("gpu_type", "price_per_gpu_hour", "effective_from")

    def clean_effective_from(self) -> Any:
        value = self.cleaned_data["effective_from"]
        now = timezone.now()
        if value < now - timedelta(minutes=1):
            raise forms.ValidationError(
                "A price takes effect now or later: prices are history (add a new one instead)."
            )
        self.takes_effect_now = value <= now
        return max(value, now)


class GpuPriceFormSet(forms.BaseInlineFormSet):
    """At most one new price of a type may take effect now: two typed "now" were both clamped to
    the instant of their own form's check, microseconds apart, and the first was "in effect" for
    about a millisecond in the price history (QA). The same typed later time twice is refused by
    the (type, effective_from) uniqueness."""

    def clean(self) -> None:
        super().clean()
        now_rows = [f for f in self.forms if f.has_changed() and getattr(f, "takes_effect_now", False)]
        if len(now_rows) > 1:
            raise forms.ValidationError(
                "Only one new price can take effect now: give the others later times (or add one at a time)."
            )


class GpuPriceInline(admin.TabularInline):
    """New prices only: the rows already there are shown, not editable (a scheduled price is
    corrected on its own page, GPU prices)."""

    model = GpuPrice
    form = GpuPriceForm
    formset = GpuPriceFormSet
    extra = 1
    ordering = ("-effective_from",)
    fields = ("price_per_gpu_hour", "effective_from")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(GpuType)
class GpuTypeAdmin(AuditedSettingAdmin):
    audit_action = "sched.gpu_type"
    list_display = ("name", "memory_gb")
    search_fields = ("name",)
    inlines = (GpuPriceInline,)

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        """A price added here is audited as one added on the GPU prices page (QA: it was not)."""
        super().save_formset(request, form, formset, change)
        for price in getattr(formset, "new_objects", ()):
            if isinstance(price, GpuPrice):
                fields = {"gpu_type": str(price.gpu_type),
                          "price_per_gpu_hour": str(price.price_per_gpu_hour),
                          "effective_from": str(price.effective_from)}
                audit_setting(request, "sched.price", price, "added", price.pk, {"fields": fields})


@admin.register(GpuPrice)
class GpuPriceAdmin(AuditedSettingAdmin):
    audit_action = "sched.price"
    form = GpuPriceForm
    list_display = ("gpu_type", "price_per_gpu_hour", "effective_from")
    list_filter = ("gpu_type",)
    ordering = ("gpu_type", "-effective_from")

    def has_change_permission(self, request: HttpRequest, obj: GpuPrice | None = None) -> bool:
        if obj is not None and not _price_not_yet_in_effect(obj):
            return False
        return super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: GpuPrice | None = None) -> bool:
        if not _price_not_yet_in_effect(obj):  # the changelist's bulk delete included
            return False
        return super().has_delete_permission(request, obj)


class AllocationInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = Allocation
    fk_name = "node"
    fields = ("gpu_index", "attempt", "allocated_at", "released_at")
    readonly_fields = fields
    extra = 0
    verbose_name_plural = "Live allocations"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Allocation]:
        return super().get_queryset(request).filter(released_at__isnull=True).select_related("attempt")


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


class NodeForm(forms.ModelForm):
    """A maintenance window set or moved here must still be to come or under way: one wholly in
    the past holds nothing back and reads as a plan (QA). A window that has passed since it was
    set does not stop the node's other fields being edited."""

    class Meta:
        model = Node
        fields = ("name", "region", "gpu_type", "gpu_count", "nvlink_domain", "ib_group", "cordon",
                  "maintenance_from", "maintenance_until")

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        window = ("maintenance_from", "maintenance_until")
        end = cleaned.get("maintenance_until")
        if end is not None and any(f in self.changed_data for f in window) and end <= timezone.now():
            self.add_error("maintenance_until", "This window has already ended: plan one that ends later.")
            # add_error dropped the end: Node.clean would then say the window had none (QA).
            cleaned["maintenance_until"] = end
        return cleaned


@admin.register(Node)
class NodeAdmin(AuditedSettingAdmin):
    """`state` is health (heartbeats and the silence sweep keep it; read-only here); an operator
    drains a node or takes it out of service with `cordon`, which heartbeats never undo. Added,
    changed and deleted nodes are audited (`sched.node.added|changed|deleted`); a change of the
    cordon or the maintenance window has its own event (`sched.node.cordon|maintenance`)."""

    audit_action = "sched.node"
    audited_apart = ("cordon", "maintenance_from", "maintenance_until")

    list_display = ("name", "region", "gpu_type", "gpu_count", "state", "cordon", "maintenance_from",
                    "maintenance_until", "ib_group", "last_heartbeat_at")
    list_filter = ("state", "cordon", "gpu_type", "region")
    search_fields = ("name", "ib_group", "nvlink_domain")
    readonly_fields = ("state", "last_heartbeat_at", "token_prefix", "agent_version", "registered_at")
    exclude = ("token_hash",)
    form = NodeForm
    inlines = (AllocationInline,)
    # Each changes the node (or replaces its agent's credential): for staff who may change nodes,
    # not for whoever may only view the list (review: a view-only user minted a node token).
    actions = ("issue_token", "drain", "take_out_of_service", "return_to_service")

    def get_readonly_fields(self, request: HttpRequest, obj: Node | None = None) -> Any:
        """Once its agent has registered, a node's GPU count is what the agent reported (its
        inventory; registration refuses a count below allocated GPUs). QA: a count edited here
        above the hardware's let the scheduler allocate GPUs that do not exist, and the jobs failed."""
        fields = tuple(super().get_readonly_fields(request, obj))
        if obj is not None and obj.registered_at is not None:
            # Its type too (registration checked the GPUs' model against it; a change here would
            # bill H100 hardware at another type's price) and its region.
            fields += ("gpu_count", "gpu_type", "region")
        return fields

    def save_model(self, request: HttpRequest, obj: Node, form: Any, change: bool) -> None:
        old = self.saved_before(obj, change)
        self._save_node(request, obj, form, change)
        self.audit_save(request, obj, form, old)

    def _save_node(self, request: HttpRequest, obj: Node, form: Any, change: bool) -> None:
        window = ("maintenance_from", "maintenance_until")
        if change and any(f in form.changed_data for f in window):
            from audit.models import AuditEvent
            from audit.services import record

            # FOR UPDATE, as a cordon: a scheduling pass writing now (FOR KEY SHARE on its nodes)
            # finishes first, or sees the window in its re-check (writer._nodes_in_service).
            list(Node.objects.select_for_update().filter(pk=obj.pk).values_list("pk", flat=True))
            record(action="sched.node.maintenance", subject_type="node", subject_id=obj.pk,
                   actor_type=AuditEvent.ActorType.USER, actor_id=str(request.user.pk),
                   reason_code="maintenance-window",
                   data={f: {"from": _iso(form.initial.get(f)), "to": _iso(getattr(obj, f))} for f in window})
        if change and "cordon" in form.changed_data:  # through the service: audited, evicts
            from scheduling.services.nodes import set_cordon

            cordon = obj.cordon
            obj.cordon = form.initial.get("cordon", "")
            self._save_changed(obj, form, change)
            set_cordon(node=obj, cordon=cordon, actor=request.user)
            obj.cordon = cordon
            return
        self._save_changed(obj, form, change)

    @staticmethod
    def _save_changed(obj: Node, form: Any, change: bool) -> None:
        """Only the fields the operator changed (review: a full-row save wrote back the health,
        heartbeat and GPU count read when the page opened over the agent's newer ones)."""
        if not change:
            obj.save()
            return
        fields = [name for name in form.changed_data if name != "cordon"]  # set_cordon writes it
        if fields:
            obj.save(update_fields=fields)

    def _cordon(self, request: HttpRequest, queryset: QuerySet[Node], cordon: str) -> None:
        from scheduling.services.nodes import set_cordon

        names = []
        for node in queryset:
            set_cordon(node=node, cordon=cordon, actor=request.user)
            names.append(node.name)
        label = NodeCordon(cordon).label
        # The admin capitalises a message's first letter: a node's name must not come first (QA).
        messages.success(request, f"{'Nodes' if len(names) > 1 else 'Node'} {', '.join(names)}: {label}.")

    @admin.action(description="Drain: no new jobs, running ones finish", permissions=["change"])
    def drain(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._cordon(request, queryset, NodeCordon.DRAIN)

    @admin.action(description="Take out of service: stop running jobs (requeued elsewhere)",
                  permissions=["change"])
    def take_out_of_service(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._cordon(request, queryset, NodeCordon.DOWN)

    @admin.action(description="Return to service", permissions=["change"])
    def return_to_service(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        self._cordon(request, queryset, NodeCordon.NONE)

    @admin.action(description="Issue a new agent token (shown once)", permissions=["change"])
    def issue_token(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        from scheduling.services.nodes import issue_node_token

        for node in queryset:
            raw = issue_node_token(node=node, actor=request.user)
            messages.warning(request, f"Token for {node.name} (copy it now, it is not shown again): {raw}")


@admin.register(PriorityClass)
class PriorityClassAdmin(AuditedSettingAdmin):
    audit_action = "sched.priority_class"
    list_display = ("name", "rank", "preemptible", "can_preempt", "restricted")
    ordering = ("-rank",)


@admin.register(PriorityGrant)
class PriorityGrantAdmin(AuditedSettingAdmin):
    """Which organizations may submit jobs of a restricted class (e.g. production)."""

    audit_action = "sched.priority_grant"
    list_display = ("org", "priority_class", "granted_at")
    list_filter = ("priority_class",)
    search_fields = ("org__slug", "org__name")
    fields = ("org", "priority_class")

    def get_readonly_fields(self, request: HttpRequest, obj: PriorityGrant | None = None) -> Any:
        # A grant is for one org: moving it would revoke one org's and grant another's in one
        # event filed under the new org only (QA). Delete it and add another instead.
        return ("org", "priority_class") if obj is not None else ()

    def formfield_for_foreignkey(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "priority_class":
            kwargs["queryset"] = PriorityClass.objects.filter(restricted=True).order_by("-rank")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


@admin.register(Quota)
class QuotaAdmin(AuditedSettingAdmin):
    audit_action = "sched.quota"
    list_display = ("org", "project", "gpu_type", "max_gpus")
    list_filter = ("gpu_type",)
    search_fields = ("org__slug", "project__slug")


class AttemptInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = JobAttempt
    fields = ("number", "state", "gpu_type", "gpu_count", "rate_per_gpu_hour", "scheduled_at",
              "started_at", "ended_at", "stop_reason", "outcome", "exit_code", "backfilled")
    readonly_fields = fields
    extra = 0


@admin.register(Job)
class JobAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "name", "org", "project", "state", "held", "wait_reason", "gpu_count",
                    "priority_class", "attempt_count", "submitted_at")
    list_filter = ("state", "held", "held_by_operator", "wait_reason", "priority_class")
    search_fields = ("name", "org__slug", "project__slug", "user__username")
    list_select_related = ("org", "project__org", "priority_class")
    readonly_fields = ("wait_reason", "wait_detail", "end_reason", "not_before", "funding_retry_at",
                       "charged", "refunded")
    inlines = (AttemptInline,)
    actions = ("cancel", "hold", "release", "refund")

    @admin.display(description="charged (credits)")
    def charged(self, job: Job) -> str:
        """Its attempts' captures, as the API's attempts `charged` sum (QA: the page did not say)."""
        from scheduling.selectors import job_charged

        return format_credits(job_charged(job.pk))

    @admin.display(description="refunded (credits)")
    def refunded(self, job: Job) -> str:
        from scheduling.selectors import job_refunded

        return format_credits(job_refunded(job.pk))
    date_hierarchy = "submitted_at"

    # Finance reaches the job list to credit a job (`scheduling.refund_job`), without being able to
    # cancel, hold or release jobs: those actions need `scheduling.operate_job`.
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return super().has_view_permission(request, obj) or self.has_refund_permission(request)

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("scheduling.operate_job")

    def has_refund_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("scheduling.refund_job")

    @admin.action(description="Credit (refund) the selected job's charges", permissions=["refund"])
    def refund(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        from config.form_keys import new_form_key
        from ledger.admin_forms import RefundForm
        from scheduling.selectors import job_charged, job_refunded
        from scheduling.services.refunds import refund_job

        jobs = list(queryset.order_by("pk")[:2])
        if len(jobs) != 1:
            messages.error(request, "Select one job to credit.")
            return None
        job = jobs[0]
        applying = "apply" in request.POST
        form = RefundForm(request.POST if applying else None, initial={"key": new_form_key()})
        if applying and form.is_valid():
            data = form.cleaned_data
            try:
                refund = refund_job(job_id=job.pk, amount=form.micro_credits(), reason=data["reason"],
                                    key=f"admin:{data['key']}", attempt_number=data["attempt"],
                                    expires_at=data["expires_at"], actor=request.user)
            except DomainError as error:
                field = {"attempt": "attempt", "expires_at": "expires_at"}.get(error.extra.get("field"))
                if isinstance(error, InvalidExpiry):
                    field = "expires_at"
                form.add_error(field if field else "credits", error.detail)
            else:
                again = " (already done: nothing new)" if refund.replayed else ""
                messages.success(request, f"Refunded {format_credits(refund.amount)} credits of job {job.pk} "
                                 f"into bucket {refund.bucket_id}{again}.")
                return None
        charged, refunded = job_charged(job.pk), job_refunded(job.pk)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": f"Credit (refund) job {job.pk}",
            "form": form,
            "job": job,
            "charged": format_credits(charged),
            "refunded": format_credits(refunded),
            "refundable": format_credits(charged - refunded),
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/scheduling/job/refund.html", context)

    def _each(self, request: HttpRequest, queryset: QuerySet[Job], change: Any, done: str) -> None:
        ok = 0
        for job in queryset:
            try:
                change(job=job, actor=request.user)
                ok += 1
            except DomainError as error:  # its detail names the job already ("Job 49 is completed; ...")
                detail = str(error.detail)
                named = detail.startswith(f"Job {job.pk} ")
                messages.error(request, detail if named else f"Job {job.pk}: {detail}")
        if ok:
            messages.success(request, f"{ok} job{'s' if ok > 1 else ''} {done}.")

    @admin.action(description="Cancel the selected jobs", permissions=["operate"])
    def cancel(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        from scheduling.services.lifecycle import cancel_job

        ended = [job.pk for job in queryset if job.state == JobState.CANCELLED]
        for job_id in ended:  # QA: counted as "cancelled" although cancel_job is a no-op for them
            messages.warning(request, f"Job {job_id} has ended (cancelled); nothing to cancel.")
        done = "cancelled (a running one stops first)"
        self._each(request, queryset.exclude(pk__in=ended), cancel_job, done)

    @admin.action(description="Hold the selected queued jobs (until an operator releases them)",
                  permissions=["operate"])
    def hold(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        from scheduling.services.holding import hold_job

        self._each(request, queryset, partial(hold_job, operator=True), "held")

    @admin.action(description="Release the selected held jobs", permissions=["operate"])
    def release(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        from scheduling.services.holding import release_job

        not_held = [job.pk for job in queryset if job.state == JobState.QUEUED and not job.held]
        for job_id in not_held:  # QA: counted as "released" although nothing changed
            messages.warning(request, f"Job {job_id} is not held; nothing to release.")
        release = partial(release_job, operator=True)
        self._each(request, queryset.exclude(pk__in=not_held), release, "released")


@admin.register(JobRefund)
class JobRefundAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Refunds are written by the Job list's "Credit (refund)" action (or the API) only."""

    list_display = ("id", "job", "attempt", "org_id", "amount", "bucket", "reason", "created_by",
                    "created_at")
    search_fields = ("reason", "key")
    list_select_related = ("job", "attempt", "bucket", "created_by")


@admin.register(JobAttempt)
class JobAttemptAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "job", "number", "state", "gpu_type", "gpu_count", "rate_per_gpu_hour",
                    "outcome", "scheduled_at", "ended_at")
    list_filter = ("state", "outcome", "gpu_type")
    list_select_related = ("job", "gpu_type")


@admin.register(Allocation)
class AllocationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "node", "gpu_index", "attempt", "allocated_at", "released_at")
    list_filter = ("node__gpu_type",)
    list_select_related = ("node", "attempt")


@admin.register(SchedulerPass)
class SchedulerPassAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "started_at", "trigger", "pending", "placed", "backfilled", "preempted",
                    "waiting_changed", "conflicts", "load_ms", "core_ms", "write_ms", "total_ms")
    list_filter = ("trigger",)
    date_hierarchy = "started_at"
