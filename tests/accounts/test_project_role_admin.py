"""Project memberships in the admin take project roles only (member, viewer): owner and admin are
organization roles that nothing reads on a project membership (QA, as on the API). A row that holds
one from before stays readable and can be saved unchanged."""

from typing import Any

import pytest

from accounts.admin import MembershipForm
from accounts.models import Membership, OrgRole
from tests.factories import MembershipFactory, ProjectFactory, UserFactory

pytestmark = pytest.mark.django_db


def form_for(instance: Membership | None, **data: Any) -> MembershipForm:
    return MembershipForm(data=data, instance=instance)


@pytest.mark.parametrize("role", [OrgRole.OWNER, OrgRole.ADMIN])
def test_org_roles_are_refused_for_new_and_changed_memberships(role: str) -> None:
    project, user = ProjectFactory(), UserFactory()
    form = form_for(None, project=project.pk, user=user.pk, role=role, fair_share_weight=1)
    # Not offered (QA: offered, then refused), so refused as any choice not on the list.
    assert [value for value, _ in form.fields["role"].choices if value] == ["member", "viewer"]
    assert not form.is_valid() and "role" in form.errors
    existing = MembershipFactory(project=project, user=user, role=OrgRole.MEMBER)
    form = form_for(existing, project=project.pk, user=user.pk, role=role, fair_share_weight=1)
    assert not form.is_valid() and "role" in form.errors
    form = form_for(existing, project=project.pk, user=user.pk, role=OrgRole.VIEWER, fair_share_weight=1)
    assert form.is_valid(), form.errors


def test_a_legacy_org_role_row_saves_unchanged() -> None:
    legacy = MembershipFactory(role=OrgRole.ADMIN)
    form = form_for(legacy, project=legacy.project_id, user=legacy.user_id, role=OrgRole.ADMIN,
                    fair_share_weight=3)
    assert form.is_valid(), form.errors
    form.save()
    legacy.refresh_from_db()
    assert (legacy.role, legacy.fair_share_weight) == (OrgRole.ADMIN, 3)
