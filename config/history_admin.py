"""Admin history pages that show, never write.

simple-history's "Revert" form saves a historical row straight through `save_model`: it skips
the services (a node's cordon, audit events) and the admins' own permission rules (a GPU price
in effect cannot be changed, read-only fields), and it would restore fields nobody should set by
hand (a node's token, its health). Hiding the button is not enough, since the form view accepts a
POST from anyone who may view the history. Here the history is read-only: to change something,
use its change page.
"""

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from simple_history.admin import SimpleHistoryAdmin


class ViewOnlyHistoryAdmin(SimpleHistoryAdmin):
    def revert_disabled(self, request: HttpRequest, obj: Any = None) -> bool:
        return True

    def history_form_view(
        self, request: HttpRequest, object_id: str, version_id: str, extra_context: Any = None
    ) -> HttpResponse:
        if request.method != "GET":
            raise PermissionDenied("History is read-only: change the object on its own page.")
        return super().history_form_view(request, object_id, version_id, extra_context)
