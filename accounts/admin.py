"""Admin for tenancy (with django-simple-history) and API keys (created by a service, shown once)."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.validators import MinValueValidator
from django.db.models import QuerySet
from django.http import HttpRequest

from accounts.models import (
    PROJECT_ROLE_MESSAGE,
    ApiKey,
    Membership,
    Organization,
    OrgMembership,
    Project,
    ProjectRole,
    Region,
)
from accounts.selectors import is_finance
from accounts.services import AccountsError, check_api_key_terms, create_api_key, revoke_api_key
from config.audited_admin import AuditedSettingAdmin
from config.history_admin import ViewOnlyHistoryAdmin


@admin.register(Region)
class RegionAdmin(AuditedSettingAdmin):
    audit_action = "accounts.region"  # nodes and wallets live in regions
    list_display = ("code", "name")
    search_fields = ("code", "name")


class OrgMembershipInline(admin.TabularInline):
    model = OrgMembership
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(Organization)
class OrganizationAdmin(ViewOnlyHistoryAdmin):
    list_display = ("slug", "name", "home_region", "hold_window_seconds", "max_inflight_submissions")

    def formfield_for_dbfield(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        """The limits' own messages for a negative value too: the form field's "greater than or
        equal to 0" (a PositiveIntegerField's) came first and read as if 0 were allowed (QA)."""
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name in ("hold_window_seconds", "max_inflight_submissions") and field is not None:
            field.validators = [v for v in field.validators
                                if not (isinstance(v, MinValueValidator) and v.limit_value == 0)]
            field.widget.attrs.pop("min", None)
        return field
    search_fields = ("slug", "name")
    list_filter = ("home_region",)
    inlines = [OrgMembershipInline]


class MembershipForm(forms.ModelForm):
    """A project membership is given a project role (member or viewer); one that holds owner or
    admin from before keeps it until someone changes it (its row stays readable and savable)."""

    class Meta:
        model = Membership
        fields = ("project", "user", "role", "fair_share_weight")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Offer the project roles only (QA: owner and admin were offered, then refused), plus the
        # row's own role from before, so it still shows and saves unchanged.
        current = self.instance.role if self.instance.pk else None
        self.fields["role"].choices = [(value, label) for value, label in self.fields["role"].choices
                                       if value in ProjectRole.values or value == current]

    def clean_role(self) -> str:
        role = self.cleaned_data["role"]
        if role not in ProjectRole.values and (self.instance.pk is None or "role" in self.changed_data):
            raise forms.ValidationError(PROJECT_ROLE_MESSAGE)
        return role


class MembershipInline(admin.TabularInline):
    model = Membership
    form = MembershipForm
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(Project)
class ProjectAdmin(ViewOnlyHistoryAdmin):
    list_display = ("slug", "name", "org", "fair_share_weight")
    search_fields = ("slug", "name", "org__slug")
    list_filter = ("org",)
    inlines = [MembershipInline]

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        # A project's jobs, holds, budgets and quotas are its org's: moving it to another org
        # would leave them pointing at the old one (and the money with them).
        return ("org",) if obj is not None else ()


@admin.register(OrgMembership)
class OrgMembershipAdmin(ViewOnlyHistoryAdmin):
    list_display = ("org", "user", "role")
    list_filter = ("role",)
    search_fields = ("org__slug", "user__username")
    autocomplete_fields = ("user",)


@admin.register(Membership)
class MembershipAdmin(ViewOnlyHistoryAdmin):
    form = MembershipForm
    list_display = ("project", "user", "role", "fair_share_weight")
    list_filter = ("role",)
    search_fields = ("project__slug", "user__username")
    autocomplete_fields = ("user",)


def key_rights_refusal(*, maker: Any, owner: Any) -> str:
    """Why `maker` may not make an API key for `owner` ("" when they may): a superuser's key only
    by a superuser, a finance user's (finance over every organization) only by finance or a
    superuser."""
    if maker is None or maker.is_superuser:
        return ""
    if owner.is_superuser:
        return "Only a superuser may make an API key for a superuser: the key acts with its user's rights."
    if is_finance(owner) and not is_finance(maker):
        return ("Only finance staff or a superuser may make an API key for a finance user: the key "
                "acts with finance rights over every organization.")
    return ""


class ApiKeyCreateForm(forms.ModelForm):
    """Only what a person chooses; the secret is generated by `create_api_key`."""

    class Meta:
        model = ApiKey
        fields = ("user", "name", "expires_at")

    maker: Any = None  # the staff user making the key, set by ApiKeyAdmin.get_form

    def clean_user(self) -> Any:
        """A key acts with its user's rights: staff make one only for a user whose API rights they
        hold themselves (review: staff with `add_apikey` alone made a key for a superuser, then
        acted as finance over every organization through the API)."""
        user = self.cleaned_data["user"]
        refusal = key_rights_refusal(maker=self.maker, owner=user)
        if refusal:
            raise forms.ValidationError(refusal)
        return user

    def clean(self) -> dict[str, Any]:
        # save_model cannot show an error: what the service would refuse is refused here, on
        # its field, by the service's own rules (QA: a past expiry was a 500 from save_model).
        cleaned = super().clean()
        if "name" in cleaned and "expires_at" in cleaned:
            try:
                check_api_key_terms(name=cleaned["name"], expires_at=cleaned["expires_at"])
            except AccountsError as error:
                field = error.extra.get("field")
                self.add_error(field if field in self.fields else None, error.detail)
        return cleaned


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "prefix", "user", "created_by", "created_at", "expires_at", "revoked_at",
                    "last_used_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "user__username")
    list_select_related = ("user", "created_by")
    readonly_fields = ("user", "name", "prefix", "created_by", "created_at", "expires_at", "revoked_at",
                       "last_used_at")
    exclude = ("key_hash",)
    actions = ["revoke_keys"]
    autocomplete_fields = ("user",)

    def get_form(self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any) -> Any:
        if obj is None:
            kwargs["form"] = type("ApiKeyCreateFormFor", (ApiKeyCreateForm,), {"maker": request.user})
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else ()

    def get_exclude(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.exclude if obj is not None else (
            "key_hash", "prefix", "revoked_at", "last_used_at", "created_by")

    def save_model(self, request: HttpRequest, obj: ApiKey, form: Any, change: bool) -> None:
        if change:
            return  # keys are immutable; revoke and create a new one instead
        key, raw = create_api_key(
            user=form.cleaned_data["user"], name=form.cleaned_data["name"],
            expires_at=form.cleaned_data.get("expires_at"), actor=request.user,
        )
        obj.pk, obj.prefix, obj.key_hash, obj.created_at = key.pk, key.prefix, key.key_hash, key.created_at
        obj.created_by = key.created_by
        messages.warning(
            request, f"New API key for {key.user} — copy it now, it is not shown again: {raw}"
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request, obj)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Revoking is audited and keeps the row (its prefix, owner and dates) for the trail; a
        # delete would erase both silently (QA: deleting a key wrote no event). Like prices in
        # effect and the ledger's rows, keys are never deleted here: revoke them.
        return False

    # For staff who may change keys (review: a view-only user could revoke anyone's).
    @admin.action(description="Revoke selected API keys", permissions=["change"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet[ApiKey]) -> None:
        count = 0
        for key in queryset.filter(revoked_at__isnull=True):
            revoke_api_key(api_key=key, actor=request.user)
            count += 1
        self.message_user(request, f"Revoked {count} key(s).", messages.SUCCESS)
