"""API keys in the admin: created through the service (audited as the admin who did it),
refused with a field error for a past expiry, never deleted (revoking is the audited way)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from accounts.models import ApiKey
from accounts.services import create_api_key
from audit.models import AuditEvent
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db

ADD = "admin:accounts_apikey_add"


def _create_event(key: ApiKey) -> AuditEvent:
    return AuditEvent.objects.get(action="accounts.api_key.create", subject_id=str(key.pk))


def test_a_key_made_in_the_admin_is_audited_as_the_admins(staff: Client, operator: Any) -> None:
    """QA: the event named the key's owner as its actor although an admin created it."""
    owner = UserFactory()
    response = staff.post(reverse(ADD), {"user": owner.pk, "name": "ci"})
    assert response.status_code == 302, response.context["adminform"].form.errors
    key = ApiKey.objects.get(user=owner)
    event = _create_event(key)
    assert (event.actor_type, event.actor_id) == ("user", str(operator.pk))
    assert event.data == {"name": "ci", "prefix": key.prefix, "user": owner.pk}
    assert key.created_by == operator  # on the key too: it is not the owner's own (daily limit)


def test_a_key_made_by_the_command_is_audited_as_the_system() -> None:
    owner = UserFactory()
    call_command("create_api_key", owner.username, "--name", "ci", stdout=StringIO())
    event = _create_event(ApiKey.objects.get(user=owner))
    assert (event.actor_type, event.actor_id) == ("system", "")
    assert event.data["user"] == owner.pk
    assert ApiKey.objects.get(user=owner).created_by is None  # the system's


def test_keys_cannot_be_deleted_in_the_admin_only_revoked(staff: Client) -> None:
    """QA: the delete action and view removed a key with no audit event (revoking writes one)."""
    key, _raw = create_api_key(user=UserFactory(), name="ci")
    delete = reverse("admin:accounts_apikey_delete", args=[key.pk])
    assert staff.post(delete, {"post": "yes"}).status_code == 403
    changelist = reverse("admin:accounts_apikey_changelist")
    actions = [name for name, _label in staff.get(changelist).context["action_form"].fields["action"].choices]
    assert "revoke_keys" in actions and "delete_selected" not in actions
    staff.post(changelist, {"action": "delete_selected", "_selected_action": [key.pk], "post": "yes"})
    assert ApiKey.objects.filter(pk=key.pk).exists()
    staff.post(changelist, {"action": "revoke_keys", "_selected_action": [key.pk]})
    key.refresh_from_db()
    assert key.revoked_at is not None
    assert AuditEvent.objects.filter(action="accounts.api_key.revoke", subject_id=str(key.pk)).exists()


@pytest.mark.parametrize("when", [timedelta(days=-1), timedelta(seconds=-1)])
def test_a_past_expiry_is_a_field_error_not_a_500(staff: Client, when: timedelta) -> None:
    """QA: Add with an expiry in the past raised AccountsError in save_model (a 500)."""
    owner = UserFactory()
    past = timezone.localtime(timezone.now() + when)
    response = staff.post(reverse(ADD), {"user": owner.pk, "name": "ci",
                                         "expires_at_0": past.strftime("%Y-%m-%d"),
                                         "expires_at_1": past.strftime("%H:%M:%S")})
    assert response.status_code == 200  # the form again, nothing saved
    assert response.context["adminform"].form.errors == {"expires_at": ["The expiry must be in the future."]}
    assert not ApiKey.objects.filter(user=owner).exists()


def test_a_future_expiry_is_saved(staff: Client) -> None:
    owner = UserFactory()
    later = timezone.localtime(timezone.now() + timedelta(days=30))
    response = staff.post(reverse(ADD), {"user": owner.pk, "name": "ci",
                                         "expires_at_0": later.strftime("%Y-%m-%d"),
                                         "expires_at_1": later.strftime("%H:%M:%S")})
    assert response.status_code == 302
    assert ApiKey.objects.get(user=owner).expires_at.date() == later.date()


def test_a_view_only_user_cannot_revoke_keys_in_the_admin(client: Client) -> None:
    """Review: "Revoke selected API keys" had no `permissions`, so staff who may only view keys (a
    support role) could revoke anyone's; it needs the change permission."""
    from django.contrib.auth.models import Permission

    key, _raw = create_api_key(user=UserFactory(), name="ci")
    viewer = UserFactory(is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(content_type__app_label="accounts",
                                                       codename="view_apikey"))
    client.force_login(viewer)
    changelist = reverse("admin:accounts_apikey_changelist")
    form = client.get(changelist).context["action_form"]
    assert form is None or "revoke_keys" not in {name for name, _label in form.fields["action"].choices}
    client.post(changelist, {"action": "revoke_keys", "_selected_action": [key.pk]})
    key.refresh_from_db()
    assert key.revoked_at is None
    editor = UserFactory(is_staff=True)
    editor.user_permissions.add(*Permission.objects.filter(content_type__app_label="accounts",
                                                           codename__in=("view_apikey", "change_apikey")))
    client.force_login(editor)
    client.post(changelist, {"action": "revoke_keys", "_selected_action": [key.pk]})
    key.refresh_from_db()
    assert key.revoked_at is not None


def _key_maker(client: Client, *groups: str) -> Any:
    """Staff who may add API keys in the admin, and nothing more (but the groups named)."""
    from django.contrib.auth.models import Group, Permission

    maker = UserFactory(is_staff=True)
    maker.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="accounts", codename__in=("add_apikey", "view_apikey")))
    for name in groups:
        maker.groups.add(Group.objects.get_or_create(name=name)[0])
    client.force_login(maker)
    return maker


@pytest.mark.parametrize("owner_kind", ["superuser", "finance"])
def test_staff_cannot_make_a_key_with_rights_they_do_not_hold(client: Client, owner_kind: str) -> None:
    """Review: staff with `add_apikey` alone made a key for a superuser and then acted, through
    the API, as finance over every organization. A key acts with its owner's rights."""
    from django.contrib.auth.models import Group

    owner = UserFactory(is_staff=owner_kind == "superuser", is_superuser=owner_kind == "superuser")
    if owner_kind == "finance":
        owner.groups.add(Group.objects.get_or_create(name="finance")[0])
    _key_maker(client)
    response = client.post(reverse(ADD), {"user": owner.pk, "name": "escalate"})
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["user"]
    assert errors and "acts with" in errors[0]
    assert not ApiKey.objects.filter(user=owner).exists()
    plain = UserFactory()
    assert client.post(reverse(ADD), {"user": plain.pk, "name": "ci"}).status_code == 302
    assert ApiKey.objects.filter(user=plain).count() == 1


def test_finance_staff_may_make_a_finance_users_key_and_a_superuser_anyones(
    client: Client, operator: Any,
) -> None:
    from django.contrib.auth.models import Group

    accountant = UserFactory()
    accountant.groups.add(Group.objects.get_or_create(name="finance")[0])
    _key_maker(client, "finance")
    assert client.post(reverse(ADD), {"user": accountant.pk, "name": "books"}).status_code == 302
    refused = client.post(reverse(ADD), {"user": operator.pk, "name": "root"})
    assert refused.status_code == 200 and not ApiKey.objects.filter(user=operator).exists()
    client.force_login(operator)
    assert client.post(reverse(ADD), {"user": operator.pk, "name": "root"}).status_code == 302
