"""Admin pages whose edits are audit events: operator settings the service obeys (GPU types, prices,
nodes, quotas, priority classes and grants, regions). Each addition, change and deletion is an
event in the hash-chained trail with who did it and what changed, not only a LogEntry and a
history row (QA)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest

from config.history_admin import ViewOnlyHistoryAdmin


def audit_setting(request: HttpRequest, action: str, obj: Any, verb: str, subject_id: Any,
                  data: dict[str, Any]) -> None:
    """`<action>.<verb>` (e.g. `sched.price.added`) by the request's user, with what changed."""
    from audit.models import AuditEvent
    from audit.services import record

    record(action=f"{action}.{verb}", subject_type=obj._meta.model_name,
           subject_id=subject_id, org_id=getattr(obj, "org_id", None),
           actor_type=AuditEvent.ActorType.USER, actor_id=str(request.user.pk), reason_code=verb,
           data={"object": str(obj), **data})


class AuditedSettingAdmin(ViewOnlyHistoryAdmin):
    """Events `<audit_action>.added|changed|deleted`: `fields` (as shown, not as ids) and, for a
    change, `before`. A save that changed none of its fields is no event."""

    audit_action = ""  # e.g. "sched.quota": events "sched.quota.added|changed|deleted"
    # Fields whose change has an event of its own (a node's cordon and maintenance window): left
    # out of `changed`, which is not written when only they changed. An addition names them all.
    audited_apart: tuple[str, ...] = ()

    def _audit(self, request: HttpRequest, obj: Any, verb: str, subject_id: Any,
               data: dict[str, Any]) -> None:
        audit_setting(request, self.audit_action, obj, verb, subject_id, data)

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        old = self.saved_before(obj, change)
        super().save_model(request, obj, form, change)
        self.audit_save(request, obj, form, old)

    @staticmethod
    def saved_before(obj: Any, change: bool) -> Any:
        """The row as stored, read before the save (for `before`); None for an addition."""
        return type(obj).objects.filter(pk=obj.pk).first() if change else None

    def audit_save(self, request: HttpRequest, obj: Any, form: ModelForm, old: Any) -> None:
        names = [n for n in form.changed_data if old is None or n not in self.audited_apart]
        if old is not None and not names:
            return
        data: dict[str, Any] = {"fields": {name: str(form.cleaned_data.get(name)) for name in names}}
        if old is not None:  # QA: a change recorded only the new values (as shown, not as ids)
            data["before"] = {name: str(getattr(old, name)) for name in names}
        self._audit(request, obj, "changed" if old is not None else "added", obj.pk, data)

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        subject_id = obj.pk
        super().delete_model(request, obj)
        self._audit(request, obj, "deleted", subject_id, {})

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        for obj in queryset:
            self.delete_model(request, obj)
