"""Finance in the Django admin: issue and void through services; journal, holds and buckets read-only."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from config.errors import DomainError
from config.form_keys import new_form_key
from config.readonly_admin import ReadOnlyAdminMixin
from ledger.admin_forms import IssueCreditsForm, VoidForm
from ledger.admin_statements import statement_view
from ledger.clock import ledger_now
from ledger.errors import IdempotencyConflict, InvalidExpiry
from ledger.models import Account, Bucket, Hold, HoldLine, LedgerTransaction, Posting, TransactionKind
from ledger.selectors import released_to_expiry_sql
from ledger.services import issue_credits, void_credits


class PostingInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = Posting
    fields = ("account", "bucket", "amount")
    readonly_fields = fields
    extra = 0


def _release_label(kind_label: str, amount: int, to_expiry: int) -> str:
    """A release is one journal kind, but part or all of it may have gone to expiry (its bucket
    had expired): finance must not read credits the org lost as credits it got back."""
    if to_expiry <= 0:
        return kind_label
    if to_expiry >= amount:
        return f"{kind_label} to expiry"
    return f"{kind_label} ({to_expiry} to expiry)"


@admin.register(LedgerTransaction)
class LedgerTransactionAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "created_at", "org", "kind_shown", "amount", "key", "hold", "request_id")
    readonly_fields = ("kind_shown",)
    list_filter = ("kind", "created_at")
    search_fields = ("key", "memo", "org__slug", "request_id", "=hold__id")
    list_select_related = ("org",)
    date_hierarchy = "created_at"
    inlines = [PostingInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[LedgerTransaction]:
        # A release has at most one expiry leg (legs on one account are merged).
        to_expiry = Posting.objects.filter(transaction=OuterRef("pk"), account=Account.EXPIRY)
        return super().get_queryset(request).annotate(to_expiry=Subquery(to_expiry.values("amount")[:1]))

    @admin.display(description="kind", ordering="kind")
    def kind_shown(self, txn: LedgerTransaction) -> str:
        label = txn.get_kind_display()
        if txn.kind != TransactionKind.RELEASE:
            return label
        return _release_label(label, txn.amount, getattr(txn, "to_expiry", None) or 0)


class HoldLineInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = HoldLine
    fields = ("bucket", "authorized", "captured", "released")
    readonly_fields = fields
    extra = 0


@admin.register(Hold)
class HoldAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "org", "project", "state", "authorized", "captured", "released",
                    "released_to_expiry", "reference", "created_at", "settled_at")
    readonly_fields = ("released_to_expiry",)
    list_filter = ("state", "created_at")
    search_fields = ("key", "reference", "org__slug", "project__slug")
    list_select_related = ("org", "project")
    inlines = [HoldLineInline]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Hold]:
        return super().get_queryset(request).annotate(to_expiry=released_to_expiry_sql())

    @admin.display(description="of which to expiry")
    def released_to_expiry(self, hold: Hold) -> int:
        """`released` counts parts whose bucket had expired; those went to expiry, not to the org."""
        return int(getattr(hold, "to_expiry", 0) or 0)


def _utc(when: datetime) -> str:
    return f"{when.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _void_message(bucket_id: int, txn: Any, *, close: bool) -> str:
    bucket = Bucket.objects.get(pk=bucket_id)
    now = ledger_now()
    done = (f"Voided {txn.amount} micro-credits of bucket {bucket_id}" if txn
            else f"Nothing was available to void in bucket {bucket_id}")  # QA: read "Bucket 10; closed."
    not_closed = "not closed: " if close else ""
    # Ended before this void (a bucket closed now has expires_at = now too).
    expired = bucket.closed_at is None and bucket.expires_at is not None and bucket.expires_at <= now
    if bucket.closed_at is not None:
        done += "; closed"
    elif bucket.effective_at >= now:
        # `void_credits` closes only a bucket in effect (its expiry cannot move before its start),
        # and none is needed: nothing can be held on it before then, and the void took the rest.
        left = (", so the void left nothing on it to spend" if not bucket.available
                else f"; {bucket.available} micro-credits stay on it")  # a part voided
        return (f"{done}; {not_closed}it is not in effect until {_utc(bucket.effective_at)}. Nothing can be "
                f"held on it before then{left}.")
    elif expired:
        done += f"; {not_closed}it expired at {_utc(bucket.expires_at)} already"
    if not bucket.held:
        return f"{done}."
    if bucket.closed_at is not None or expired:
        return (f"{done}{'. The' if expired else ': the'} {bucket.held} micro-credits still held by jobs "
                "(running or queued) may still be spent by them; what they give back will expire.")
    return f"{done}; the {bucket.held} micro-credits still held become available again when released."


@admin.register(Bucket)
class BucketAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Buckets are read-only; finance issues with the "Issue credits" view and voids with an action."""

    list_display = ("id", "org", "project", "kind", "source", "granted", "available", "held", "spent",
                    "expired", "voided", "effective_at", "expires_at", "reference")
    list_filter = ("kind", "source", "expires_at", "effective_at")
    search_fields = ("reference", "reason", "org__slug", "project__slug")
    list_select_related = ("org", "project")
    actions = ["void_available"]
    change_list_template = "admin/ledger/bucket/change_list.html"

    def has_issue_credits_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ledger.issue_credits")

    def has_void_credits_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("ledger.void_credits")

    def get_urls(self) -> list[URLPattern]:
        issue = path(
            "issue/", self.admin_site.admin_view(self.issue_view), name="ledger_bucket_issue"
        )
        statement = path("statement/", self.admin_site.admin_view(self.statement_view),
                         name="ledger_bucket_statement")
        return [issue, statement, *super().get_urls()]

    def statement_view(self, request: HttpRequest) -> HttpResponse:
        context = {**self.admin_site.each_context(request), "opts": self.model._meta}
        return statement_view(request, context)

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra = {"can_issue": self.has_issue_credits_permission(request), **(extra_context or {})}
        return super().changelist_view(request, extra_context=extra)

    def issue_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_issue_credits_permission(request):
            raise PermissionDenied
        form = IssueCreditsForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                bucket = issue_credits(
                    org=data["org"], amount=form.micro_credits(), kind=data["kind"],
                    source=data["source"], reference=data["reference"], reason=data["reason"],
                    effective_at=data["effective_at"], expires_at=data["expires_at"],
                    project=data["project"], gpu_types=data["gpu_types"], actor=request.user,
                )
            except DomainError as error:
                form.add_error("expires_at" if isinstance(error, InvalidExpiry) else None, error.detail)
            else:
                if bucket.replayed:
                    self.message_user(
                        request,
                        f"Reference {bucket.reference!r} was already issued as bucket {bucket.pk} "
                        f"({bucket.granted} micro-credits); nothing new was issued.",
                        messages.WARNING,
                    )
                else:
                    self.message_user(request, f"Issued bucket {bucket.pk} ({bucket.granted} micro-credits).")
                return HttpResponseRedirect(reverse("admin:ledger_bucket_change", args=[bucket.pk]))
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Issue credits",
            "form": form,
        }
        return TemplateResponse(request, "admin/ledger/bucket/issue.html", context)

    @admin.action(description="Void available credits of the selected buckets (all or part; close them)",
                  permissions=["void_credits"])
    def void_available(self, request: HttpRequest, queryset: QuerySet[Bucket]) -> HttpResponse | None:
        applying = "apply" in request.POST
        form = VoidForm(request.POST if applying else None, buckets=queryset.count(),
                        initial={"key": new_form_key()})
        if applying and form.is_valid():
            # The form's key, made when it was shown: the same form submitted twice voids once
            # (QA: a key made per POST voided a part twice on a double click).
            batch = form.cleaned_data["key"]
            for bucket in queryset.order_by("pk"):
                try:
                    txn = void_credits(
                        bucket=bucket, reason=form.cleaned_data["reason"], key=f"admin:{batch}:{bucket.pk}",
                        actor=request.user, close=form.cleaned_data["close"], amount=form.micro_credits(),
                    )
                except IdempotencyConflict as error:
                    self.message_user(request, f"Bucket {bucket.pk}: {error.detail} Open the action again "
                                      "for another void.", messages.WARNING)
                except DomainError as error:
                    self.message_user(request, f"Bucket {bucket.pk}: {error.detail}", messages.WARNING)
                else:
                    if txn is not None and txn.replayed:
                        self.message_user(request, f"Voided {txn.amount} micro-credits of bucket {bucket.pk} "
                                          "(already done: nothing new).", messages.WARNING)
                        continue
                    message = _void_message(bucket.pk, txn, close=form.cleaned_data["close"])
                    self.message_user(request, message)
            return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "title": "Void available credits",
            "form": form,
            "buckets": queryset,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/ledger/bucket/void.html", context)
