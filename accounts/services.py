"""Writes of the accounts app: API keys, organizations, projects, memberships, idempotency reaping."""

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from accounts.keys import hash_key, new_key
from accounts.models import (
    PROJECT_ROLE_MESSAGE,
    ApiKey,
    IdempotencyRecord,
    Membership,
    Organization,
    OrgMembership,
    OrgRole,
    Project,
    ProjectRole,
    Region,
)
from accounts.selectors import org_people, usable_api_keys
from audit.services import record
from config.clock import db_now
from config.errors import DomainError

# Also for a user outside the org: the same words, so nobody learns who exists elsewhere.
NO_SUCH_USER = "No such active user."


class AccountsError(DomainError):
    type = "validation-error"
    status = 400
    title = "Invalid request"


class Conflict(DomainError):
    type = "conflict"
    status = 409
    title = "Conflicts with an existing object"


class TooManyKeys(DomainError):
    type = "too-many-api-keys"
    status = 409
    title = "Too many active API keys"


class TooManyNewKeys(TooManyKeys):
    type = "too-many-new-api-keys"
    title = "Too many API keys made today"


def _actor(actor: Any) -> dict[str, str]:
    if actor is None:
        return {"actor_type": "system", "actor_id": ""}
    return {"actor_type": "user", "actor_id": str(actor.pk)}


def check_api_key_terms(*, name: str, expires_at: datetime | None) -> None:
    """The rules `create_api_key` applies, for forms to show as field errors before calling it
    (QA: the admin's Add with a past expiry was a 500)."""
    if not name or len(name) > 100:
        raise AccountsError("An API key needs a name of 1-100 characters.", field="name")
    if expires_at is not None and expires_at <= timezone.now():
        raise AccountsError("The expiry must be in the future.", field="expires_at")


@transaction.atomic
def create_api_key(
    *, user: Any, name: str, expires_at: datetime | None = None, actor: Any = None, via: str = ""
) -> tuple[ApiKey, str]:
    """Create a key for `user`; the raw key is returned once and never stored (only its hash).

    `actor` is who created it (the admin's user; None: the system, e.g. `manage.py create_api_key`),
    which is not always the key's owner (QA: an admin's key for a user was audited as the user's);
    it is kept on the key (`created_by`) as well as in the audit event.
    """
    check_api_key_terms(name=name, expires_at=expires_at)
    raw, prefix = new_key()
    key = ApiKey.objects.create(
        user=user, name=name, prefix=prefix, key_hash=hash_key(raw), expires_at=expires_at, created_by=actor
    )
    record(action="accounts.api_key.create", subject_type="api_key", subject_id=key.pk,
           data={"name": name, "prefix": prefix, "user": user.pk, **({"via": via} if via else {})},
           **_actor(actor))
    return key, raw


@transaction.atomic
def revoke_api_key(*, api_key: ApiKey, actor: Any = None) -> ApiKey:
    """Revoke a key (idempotent: revoking twice keeps the first revocation time)."""
    changed = ApiKey.objects.filter(pk=api_key.pk, revoked_at__isnull=True).update(revoked_at=db_now())
    # This process's authentication cache drops the key now and after commit (a request racing
    # the commit could re-cache the unrevoked row); other processes within API_KEY_CACHE_SECONDS.
    from accounts.api.authentication import forget_api_key

    forget_api_key(api_key.prefix)
    transaction.on_commit(lambda: forget_api_key(api_key.prefix))
    if changed:
        record(action="accounts.api_key.revoke", subject_type="api_key", subject_id=api_key.pk,
               data={"prefix": api_key.prefix}, **_actor(actor))
    api_key.refresh_from_db()
    return api_key


def key_state(key: ApiKey, now: datetime | None = None) -> str:
    """`revoked`, `expired` or `active`: what a request with the key would meet."""
    if key.revoked_at is not None:
        return "revoked"
    if key.expires_at is not None and key.expires_at <= (now or timezone.now()):
        return "expired"
    return "active"


@transaction.atomic
def create_own_api_key(
    *, user: Any, name: str, expires_at: datetime | None = None, via: str = "portal"
) -> tuple[ApiKey, str]:
    """A key a signed-in user makes for themselves (the portal; the API with a browser session,
    never with another key: review, a leaked or short-lived key could mint a permanent one).

    At most `API_KEYS_MAX_ACTIVE_PER_USER` usable keys (whoever made them) and
    `API_KEYS_MAX_CREATED_PER_DAY` new ones the user made themselves in 24 h (review: create/revoke
    churn was unlimited; an admin's keys for them were counted too), counted under a lock on the
    user's row, re-read there, so two concurrent requests cannot both take the last place and
    a user deactivated meanwhile makes none. `via` is recorded in the audit event."""
    check_api_key_terms(name=name, expires_at=expires_at)
    locked = get_user_model().objects.select_for_update().filter(pk=user.pk, is_active=True).exists()
    if not locked:
        raise AccountsError("This account is not active.", field="user")
    now = db_now()
    # The daily limit counts the keys the user made themselves: an admin's or the system's keys for
    # them are not their churn (review: they were counted, the rows did not say who made them).
    mine, active = ApiKey.objects.filter(user=user, created_by=user), usable_api_keys(user, now)
    limit, per_day = int(settings.API_KEYS_MAX_ACTIVE_PER_USER), int(settings.API_KEYS_MAX_CREATED_PER_DAY)
    if (count := active.count()) >= limit:
        raise TooManyKeys(
            f"You have {count} active API keys, the most allowed is {limit}: revoke one you no "
            "longer use first.", active=count, limit=limit,
        )
    if (made := mine.filter(created_at__gt=now - timedelta(days=1)).count()) >= per_day:
        raise TooManyNewKeys(
            f"You made {made} API keys in the last 24 hours, the most allowed is {per_day}: "
            "try again later.", made=made, limit=per_day,
        )
    return create_api_key(user=user, name=name, expires_at=expires_at, actor=user, via=via)


@transaction.atomic
def create_organization(
    *,
    name: str,
    slug: str,
    home_region: Region | None = None,
    owner: Any = None,
    hold_window_seconds: int | None = None,
    max_inflight_submissions: int | None = None,
    actor: Any = None,
) -> Organization:
    if Organization.objects.filter(slug=slug).exists():
        raise Conflict(f"An organization with slug {slug!r} already exists.", field="slug")
    org = Organization(name=name, slug=slug, home_region=home_region,
                       hold_window_seconds=hold_window_seconds)
    if max_inflight_submissions is not None:
        org.max_inflight_submissions = max_inflight_submissions
    org.save()
    if owner is not None:
        OrgMembership.objects.create(org=org, user=owner, role=OrgRole.OWNER)
    record(action="accounts.org.create", subject_type="org", subject_id=org.pk, org_id=org.pk,
           data={"slug": slug, "owner": owner.pk if owner is not None else None}, **_actor(actor))
    return org


@transaction.atomic
def create_project(*, org: Organization, name: str, slug: str, actor: Any = None) -> Project:
    if Project.objects.filter(org=org, slug=slug).exists():
        raise Conflict(f"Project {slug!r} already exists in {org.slug}.", field="slug")
    project = Project.objects.create(org=org, name=name, slug=slug)
    record(action="accounts.project.create", subject_type="project", subject_id=project.pk,
           org_id=org.pk, data={"slug": slug}, **_actor(actor))
    return project


@transaction.atomic
def add_project_member(
    *, project: Project, user: Any, role: str = ProjectRole.MEMBER, actor: Any = None
) -> tuple[Membership, bool]:
    """Add `user`, who must already belong to the project's org (`org_people`), to `project`
    (or change their role). Returns (membership, created); `membership.unchanged` is True when
    they already had that role: nothing was written and no event recorded."""
    if role not in ProjectRole.values:
        raise AccountsError(f"Not a project role: {role!r}. {PROJECT_ROLE_MESSAGE}", field="role")
    if not org_people(project.org_id).filter(pk=user.pk).exists():
        # Joining an org is the admin's (or the org's creation); projects take its people only.
        raise AccountsError(NO_SUCH_USER, field="user")
    # The row is read locked (FOR UPDATE), and a concurrent add that inserted it first is read
    # locked after its commit (get_or_create's retry on the unique constraint), so the role is
    # compared and changed under the lock: of concurrent adds one adds and each later one changes
    # the role it found, or nothing.
    membership, created = Membership.objects.select_for_update().get_or_create(
        project=project, user=user, defaults={"role": role}
    )
    data = {"project": project.pk, "user": user.pk, "role": role}
    # QA: adding someone again with the role they had wrote an `accounts.member.role` event each
    # time (six concurrent adds: one `add` and five `role`); now nothing is written.
    membership.unchanged = not created and membership.role == role
    if created:
        record(action="accounts.member.add", subject_type="membership", subject_id=membership.pk,
               org_id=project.org_id, data=data, **_actor(actor))
    elif not membership.unchanged:
        previous = membership.role
        Membership.objects.filter(pk=membership.pk).update(role=role)
        membership.role = role
        record(action="accounts.member.role", subject_type="membership", subject_id=membership.pk,
               org_id=project.org_id, data={**data, "previous_role": previous}, **_actor(actor))
    return membership, created


def reap_idempotency_records(*, limit: int = 5000) -> int:
    """Delete expired idempotency records in bounded batches; returns how many were deleted."""
    ids = list(
        IdempotencyRecord.objects.filter(expires_at__lt=db_now())
        .order_by("expires_at")
        .values_list("pk", flat=True)[:limit]
    )
    if not ids:
        return 0
    deleted, _ = IdempotencyRecord.objects.filter(pk__in=ids, expires_at__lt=db_now()).delete()
    return deleted
