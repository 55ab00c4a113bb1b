"""Portal fixtures: two orgs with paid + promotional credits, a hold with a capture, a running job."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone

from accounts.models import Organization, OrgRole, Project, Region
from ledger.models import MICRO, Bucket, BucketKind, Hold
from ledger.services import capture, place_hold
from metering.models import AttemptUsage
from scheduling.models import (
    Allocation,
    AttemptState,
    GpuType,
    Job,
    JobAttempt,
    JobState,
    Node,
    NodeState,
    PriorityClass,
)
from tests.factories import (
    GpuTypeFactory,
    MembershipFactory,
    OrganizationFactory,
    OrgMembershipFactory,
    ProjectFactory,
    UserFactory,
    fund,
)

PASSWORD = "pw"  # tests.factories.UserFactory's password


@dataclass
class World:
    """Users, orgs and money the portal tests look at."""

    alice: object  # member of acme (org) and acme/vision (project)
    bob: object  # owner of globex only
    carol: object  # finance staff, no membership
    dave: object  # member of the acme/vision project only
    acme: Organization
    vision: Project
    globex: Organization
    paid: Bucket
    promo: Bucket
    project_promo: Bucket
    hold: Hold
    job: Job
    h100: GpuType


def _running_job(*, org: Organization, project: Project, user: object, hold: Hold, h100: GpuType) -> Job:
    now = timezone.now()
    node = Node.objects.create(name="node-a1", region=_region(), gpu_type=h100, gpu_count=8,
                               state=NodeState.READY)
    priority, _ = PriorityClass.objects.get_or_create(name="normal", defaults={"rank": 10})
    job = Job.objects.create(
        org=org, project=project, user=user, name="train-resnet", gpu_types=["H100"], gpu_count=2,
        max_wall_seconds=3600, priority_class=priority, state=JobState.RUNNING, current_hold=hold,
        submitted_at=now - timedelta(minutes=20),
    )
    attempt = JobAttempt.objects.create(
        job=job, number=1, org_id=org.id, state=AttemptState.RUNNING, gpu_type=h100, gpu_count=2,
        rate_per_gpu_hour=4 * MICRO, hold=hold, scheduled_at=now - timedelta(minutes=10),
        started_at=now - timedelta(minutes=10),
    )
    for index in (0, 1):
        Allocation.objects.create(attempt=attempt, node=node, gpu_index=index, allocated_at=now)
    AttemptUsage.objects.create(
        attempt=attempt, org_id=org.id, reported_gpu_ms=1_200_000, billable_gpu_ms=1_200_000,
        gpu_utilization=73.0,
    )
    return job


def _region() -> Region:
    region, _ = Region.objects.get_or_create(code="eu-west", defaults={"name": "EU West"})
    return region


def build_world() -> World:
    now = timezone.now()
    h100 = GpuTypeFactory(name="H100", memory_gb=80)
    acme = OrganizationFactory(name="Acme Research", slug="acme")
    vision = ProjectFactory(org=acme, name="Vision", slug="vision")
    globex = OrganizationFactory(name="Globex", slug="globex")
    alice, bob, carol, dave = (UserFactory(username=name) for name in ("alice", "bob", "carol", "dave"))
    OrgMembershipFactory(org=acme, user=alice, role=OrgRole.MEMBER)
    MembershipFactory(project=vision, user=alice)
    MembershipFactory(project=vision, user=dave)
    OrgMembershipFactory(org=globex, user=bob, role=OrgRole.OWNER)
    carol.groups.add(Group.objects.get_or_create(name="finance")[0])

    paid = fund(acme, 1_000 * MICRO, kind=BucketKind.PAID, expires_at=now + timedelta(days=60))
    promo = fund(acme, 50 * MICRO, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(days=5))
    project_promo = fund(acme, 20_500_000, kind=BucketKind.PROMOTIONAL, project=vision,
                         expires_at=now + timedelta(days=20))
    ops = ProjectFactory(org=acme, name="Ops", slug="ops")
    fund(acme, 300 * MICRO, kind=BucketKind.PAID, project=ops)  # not spendable by vision
    fund(globex, 777 * MICRO, kind=BucketKind.PAID)
    hold = place_hold(org=acme, amount=80 * MICRO, key="portal-hold-1", project=vision, user=alice)
    capture(hold=hold, amount=12_345_678, key="portal-capture-1")
    job = _running_job(org=acme, project=vision, user=alice, hold=hold, h100=h100)
    return World(alice=alice, bob=bob, carol=carol, dave=dave, acme=acme, vision=vision, globex=globex,
                 paid=paid, promo=promo, project_promo=project_promo, hold=hold, job=job, h100=h100)


@pytest.fixture
def world(db: None) -> World:
    return build_world()
