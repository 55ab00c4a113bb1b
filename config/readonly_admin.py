"""An admin mixin for rows written only by the services: viewable, never added, changed or deleted."""

from typing import Any

from django.http import HttpRequest


class ReadOnlyAdminMixin:
    """Viewable with the view permission; nobody adds, changes or deletes rows here (ledger
    journal, holds, audit events, jobs and their attempts, budgets: each has its service)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
