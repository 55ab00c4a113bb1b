"""Tenancy reads: which orgs and projects a user may see and manage.

The API answers 404 for anything outside a caller's tenancy (never 403, which would confirm the
object exists); 403 is reserved for callers who may see an object but not change it.

- Finance (group "finance", or a superuser) sees every org and project and runs finance routes.
- Any org membership (owner/admin/member/viewer) sees the whole org and all its projects.
- A project membership sees that project (and its org's existence, not its other projects).
- Submitting jobs needs a non-viewer project membership, or org owner/admin.
"""

from functools import cache
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection
from django.db.models import Exists, Model, OuterRef, Q, QuerySet
from rest_framework.exceptions import NotFound, PermissionDenied

from accounts.models import ApiKey, Membership, Organization, OrgMembership, OrgRole, Project
from config import prepared

FINANCE_GROUP = "finance"
ORG_MANAGER_ROLES = (OrgRole.OWNER, OrgRole.ADMIN)

AnyUser = AbstractBaseUser | AnonymousUser


def is_finance(user: AnyUser) -> bool:
    if not user.is_authenticated:
        return False
    cached = getattr(user, "_gpubank_is_finance", None)
    if cached is None:
        cached = bool(user.is_superuser or user.groups.filter(name=FINANCE_GROUP).exists())
        user._gpubank_is_finance = cached  # type: ignore[union-attr]
    return cached


def visible_orgs(user: AnyUser) -> QuerySet[Organization]:
    return Organization.objects.all() if is_finance(user) else member_orgs(user)


def member_orgs(user: AnyUser) -> QuerySet[Organization]:
    """The orgs `user` belongs to: by an org role or a project membership."""
    return Organization.objects.filter(
        Q(memberships__user=user) | Q(projects__memberships__user=user)
    ).distinct()


def visible_projects(user: AnyUser) -> QuerySet[Project]:
    if is_finance(user):
        return Project.objects.all()
    return Project.objects.filter(Q(org__memberships__user=user) | Q(memberships__user=user)).distinct()


def org_projects(user: AnyUser, org: Organization) -> QuerySet[Project]:
    """The projects of `org` that `user` sees: all of them for finance and any org membership, a
    project-only member's own projects (the org's other projects stay unknown to them)."""
    return visible_projects(user).filter(org=org).order_by("id")


def project_members(project: Project) -> QuerySet[Membership]:
    """Who belongs to `project`, with their project role; for anyone who sees the project (org
    members and finance already read every project's members by id and username in the org's
    fair-share tree, and a project's members see one another's jobs)."""
    return Membership.objects.filter(project=project).select_related("user").order_by("id")


def org_people(org_id: int) -> QuerySet[Any]:
    """Active users who already belong to the org: an org membership or a membership of one of
    its projects. Only they can be added to its projects by the API (QA: an org owner could look
    up and add any user of the platform, and learn other orgs' usernames); a newcomer joins an org
    through the admin (an org membership, or a project membership) or as the owner it is created with."""
    return get_user_model().objects.filter(is_active=True).filter(
        Exists(OrgMembership.objects.filter(org_id=org_id, user=OuterRef("pk")))
        | Exists(Membership.objects.filter(project__org_id=org_id, user=OuterRef("pk")))
    )


def org_role(user: AnyUser, org_id: int) -> str | None:
    return (
        OrgMembership.objects.filter(user=user, org_id=org_id).values_list("role", flat=True).first()
    )


def get_visible_org(user: AnyUser, org_id: int) -> Organization:
    org = visible_orgs(user).filter(pk=org_id).first()
    if org is None:
        raise NotFound("No such organization.")
    return org


def get_visible_project(user: AnyUser, project_id: int) -> Project:
    project = visible_projects(user).select_related("org").filter(pk=project_id).first()
    if project is None:
        raise NotFound("No such project.")
    return project


def _columns(model: type[Model], alias: str) -> tuple[list[str], str]:
    fields = [f.attname for f in model._meta.concrete_fields]
    return fields, ", ".join(f'{alias}."{f.column}"' for f in model._meta.concrete_fields)


@cache
def _submit_project_sql() -> tuple[str, list[str], list[str]]:
    project_fields, project_cols = _columns(Project, "p")
    org_fields, org_cols = _columns(Organization, "o")
    sql = (
        f"SELECT {project_cols}, {org_cols}, "  # noqa: S608 (identifiers from model metadata)
        f"(SELECT m.role FROM {OrgMembership._meta.db_table} m "
        "WHERE m.org_id = p.org_id AND m.user_id = %s ORDER BY m.id LIMIT 1), "
        f"(SELECT m.role FROM {Membership._meta.db_table} m "
        "WHERE m.project_id = p.id AND m.user_id = %s ORDER BY m.id LIMIT 1) "
        f"FROM {Project._meta.db_table} p JOIN {Organization._meta.db_table} o ON o.id = p.org_id "
        "WHERE p.id = %s"
    )
    return sql, project_fields, org_fields


def get_visible_project_for_submit(user: AnyUser, project_id: int) -> Project:
    """`get_visible_project` in one statement that also reads the caller's roles, so the
    `can_submit` that follows costs no query (the roles are kept on the returned project).

    Plain SQL: on the submission path the ORM's query compilation cost more than the query.
    """
    sql, project_fields, org_fields = _submit_project_sql()
    # Prepared: planning this join cost ~4x running it.
    row = prepared.execute(sql, [user.pk, user.pk, project_id])
    if row is None:
        raise NotFound("No such project.")
    n = len(project_fields)
    org_level, project_level = row[-2], row[-1]
    if not (is_finance(user) or org_level is not None or project_level is not None):
        raise NotFound("No such project.")
    project = Project.from_db(connection.alias, project_fields, row[:n])
    org = Organization.from_db(connection.alias, org_fields, row[n:n + len(org_fields)])
    Project._meta.get_field("org").set_cached_value(project, org)
    project._gpubank_roles = (user.pk, org_level, project_level)  # type: ignore[attr-defined]
    return project


def require_org_manager(user: AnyUser, org: Organization) -> None:
    """Org owners/admins (and finance) may manage an org's projects, members and budgets."""
    if is_finance(user) or org_role(user, org.pk) in ORG_MANAGER_ROLES:
        return
    raise PermissionDenied("Only the organization's owners and admins may do this.")


def require_org_reader(user: AnyUser, org: Organization, what: str = "its balance and journal") -> None:
    """Org-wide money (balance, journal, budgets, fair share) is for org members and finance, not
    project-only members. `what` names the resource asked for in the refusal."""
    if is_finance(user) or org_role(user, org.pk) is not None:
        return
    raise PermissionDenied(f"Only members of the organization may read {what}.")


def require_finance(user: AnyUser) -> None:
    if not is_finance(user):
        raise PermissionDenied("Only finance staff may do this.")


def can_submit(user: AnyUser, project: Project) -> bool:
    """A non-viewer project member, or an org owner/admin (roles read by
    `get_visible_project_for_submit` in the same request are reused)."""
    cached = getattr(project, "_gpubank_roles", None)
    if cached is not None and cached[0] == user.pk:
        org_level, role = cached[1], cached[2]
    else:
        org_level = org_role(user, project.org_id)
        role = None
        if org_level not in ORG_MANAGER_ROLES:
            role = (
                Membership.objects.filter(user=user, project=project)
                .values_list("role", flat=True).first()
            )
    if org_level in ORG_MANAGER_ROLES:
        return True
    return role is not None and role != OrgRole.VIEWER


def job_write_refusal(user: AnyUser, project: Project, verb: str) -> str:
    """The 403 message for a caller `can_submit` refused, saying which rule stopped them: a project
    viewer *is* a project member, so "only project members may ..." would mislead her. Reads the
    roles cached by `get_visible_project_for_submit` when present, else one query (refusals only)."""
    cached = getattr(project, "_gpubank_roles", None)
    if cached is not None and cached[0] == user.pk:
        role = cached[2]
    else:
        role = Membership.objects.filter(user=user, project=project).values_list("role", flat=True).first()
    if role == OrgRole.VIEWER:
        return (f"Project viewers cannot {verb} jobs; project members with any other role, "
                "and org owners/admins, can.")
    return f"Only project members (any role but viewer) and org owners/admins may {verb} jobs here."


def own_api_keys(user: AnyUser) -> QuerySet[ApiKey]:
    """The user's own API keys, newest first (revoked and expired ones too: their history)."""
    return ApiKey.objects.filter(user_id=user.pk).order_by("-id")


def usable_api_keys(user: AnyUser, now: Any) -> QuerySet[ApiKey]:
    """The user's keys a request could use at `now`: not revoked, not expired."""
    return own_api_keys(user).filter(revoked_at__isnull=True).filter(
        Q(expires_at__isnull=True) | Q(expires_at__gt=now))
