"""factory-boy factories for the tenancy models and credit buckets (shared by every app's tests).

`BucketFactory` writes a bare bucket row with no journal behind it; tests of money movement should
fund an org with `fund(...)` (which goes through `ledger.services.issue_credits`) so that the
postings and the bucket columns agree and `verify_ledger` stays clean.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from accounts.models import Membership, Organization, OrgMembership, OrgRole, Project
from ledger.models import MICRO, Bucket, BucketKind, BucketSource
from scheduling.models import GpuType


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ("username",)
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    password = factory.PostGenerationMethodCall("set_password", "pw")

    @factory.post_generation
    def _save(obj: Any, create: bool, extracted: Any, **kwargs: Any) -> None:
        if create:
            obj.save()


class OrganizationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Organization

    name = factory.Sequence(lambda n: f"Org {n}")
    slug = factory.Sequence(lambda n: f"org-{n}")


class ProjectFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Project

    org = factory.SubFactory(OrganizationFactory)
    name = factory.Sequence(lambda n: f"Project {n}")
    slug = factory.Sequence(lambda n: f"project-{n}")


class OrgMembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = OrgMembership

    org = factory.SubFactory(OrganizationFactory)
    user = factory.SubFactory(UserFactory)
    role = OrgRole.MEMBER


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    project = factory.SubFactory(ProjectFactory)
    user = factory.SubFactory(UserFactory)
    role = OrgRole.MEMBER


class GpuTypeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuType
        django_get_or_create = ("name",)

    name = "H100"
    memory_gb = 80


class BucketFactory(factory.django.DjangoModelFactory):
    """A bucket row without postings: for read-side tests only (see module docstring)."""

    class Meta:
        model = Bucket

    org = factory.SubFactory(OrganizationFactory)
    project = None
    kind = BucketKind.PAID
    source = BucketSource.PURCHASE
    gpu_types = factory.LazyFunction(list)
    effective_at = factory.LazyFunction(lambda: timezone.now() - timedelta(days=1))
    expires_at = None
    granted = 100 * MICRO
    available = factory.SelfAttribute("granted")
    reference = factory.Sequence(lambda n: f"ref-{n}")
    reason = "test"


def fund(
    org: Organization,
    amount: int,
    *,
    kind: str = BucketKind.PAID,
    source: str | None = None,
    project: Project | None = None,
    expires_at: datetime | None = None,
    effective_at: datetime | None = None,
    gpu_types: tuple[str, ...] = (),
    reference: str | None = None,
) -> Bucket:
    """Issue credits through the ledger service (journal + audit), the way finance does."""
    from ledger.services import issue_credits

    if source is None:
        source = BucketSource.PURCHASE if kind == BucketKind.PAID else BucketSource.PROMOTION
    fund.counter += 1  # type: ignore[attr-defined]
    return issue_credits(
        org=org,
        amount=amount,
        kind=kind,
        source=source,
        reference=reference or f"fund-{fund.counter}",  # type: ignore[attr-defined]
        reason="test funding",
        effective_at=effective_at,
        expires_at=expires_at,
        project=project,
        gpu_types=gpu_types,
    )


fund.counter = 0  # type: ignore[attr-defined]
