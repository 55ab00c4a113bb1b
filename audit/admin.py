"""The audit trail in the admin: read-only, filterable, searchable."""

from __future__ import annotations

from django.contrib import admin

from audit.models import AuditEvent
from config.readonly_admin import ReadOnlyAdminMixin


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("id", "created_at", "org_id", "action", "actor_type", "actor_id", "subject_type",
                    "subject_id", "amount", "reason_code", "request_id")
    list_filter = ("action", "actor_type", "subject_type", "created_at")
    search_fields = ("action", "subject_id", "actor_id", "request_id", "reason_code", "=org_id")
    date_hierarchy = "created_at"
