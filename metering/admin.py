"""Read-only admin for metered usage: usage is written by heartbeats and settlement only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from metering.models import AttemptUsage


@admin.register(AttemptUsage)
class AttemptUsageAdmin(admin.ModelAdmin):
    list_display = (
        "attempt",
        "org_id",
        "last_seq",
        "reported_gpu_ms",
        "billable_gpu_ms",
        "captured_gpu_ms",
        "gpu_utilization",
        "last_heartbeat_at",
        "settled_at",
    )
    list_filter = ("settled_at",)
    search_fields = ("attempt__id", "org_id")
    list_select_related = ("attempt",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
