"""Load demo data for the one-command demo: orgs, projects, users, credits, a GPU fleet.

Idempotent: running it again changes nothing (grants are keyed by their finance reference).
"""

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from accounts.models import Membership, Organization, OrgMembership, OrgRole, Project, Region
from config.env import env
from ledger.models import MICRO, Bucket, BucketKind, BucketSource
from ledger.services import issue_credits
from scheduling.models import GpuPrice, GpuType, Node, PriorityClass, PriorityGrant

GPU_TYPES = [("H100", 80, 4_000_000), ("A100", 80, 2_500_000), ("L4", 24, 800_000)]
# name, region, gpu type, gpus, nvlink domain, ib group
NODES = [
    ("demo-h100-1", "us-east", "H100", 8, "nvl-h1", "ib-east-1"),
    ("demo-h100-2", "us-east", "H100", 8, "nvl-h2", "ib-east-1"),
    ("demo-a100-1", "us-east", "A100", 4, "nvl-a1", "ib-east-2"),
    ("demo-l4-1", "eu-west", "L4", 4, "", ""),
]
ORGS = {
    "acme": ("Acme AI", [("vision", "Vision"), ("llm", "LLM pre-training")], ["alice", "bob"]),
    "globex": ("Globex Research", [("speech", "Speech")], ["carol"]),
}


class Command(BaseCommand):
    help = "Load the demo organizations, users, credits and fleet (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        password = env.str("DEMO_PASSWORD", default="gpubank-demo")
        with transaction.atomic():
            self._fleet()
            users = self._users(password)
            self._tenants(users)
            self._grants()
        self.stdout.write(
            self.style.SUCCESS(
                "Demo data ready.\n"
                f"  Admin:   http://127.0.0.1:8000/admin/  user admin / {password}\n"
                f"  Finance: user fiona / {password}\n"
                f"  Users:   alice, bob (acme), carol (globex) / {password}\n"
            )
        )

    def _fleet(self) -> None:
        regions = {
            code: Region.objects.get_or_create(code=code, defaults={"name": code})[0]
            for code in ("us-east", "eu-west")
        }
        since = timezone.now() - timedelta(days=30)
        for name, memory, price in GPU_TYPES:
            gpu_type, _ = GpuType.objects.get_or_create(name=name, defaults={"memory_gb": memory})
            GpuPrice.objects.get_or_create(
                gpu_type=gpu_type, effective_from=since, defaults={"price_per_gpu_hour": price}
            )
        for name, region, type_name, count, nvlink, ib in NODES:
            Node.objects.get_or_create(
                name=name,
                defaults={
                    "region": regions[region],
                    "gpu_type": GpuType.objects.get(name=type_name),
                    "gpu_count": count,
                    "nvlink_domain": nvlink,
                    "ib_group": ib,
                },
            )

    def _users(self, password: str) -> dict[str, Any]:
        user_model = get_user_model()
        users = {}
        for username in ("admin", "fiona", "alice", "bob", "carol"):
            user, created = user_model.objects.get_or_create(username=username)
            if created:
                user.set_password(password)
                user.is_staff = username in ("admin", "fiona")
                user.is_superuser = username == "admin"
                user.save()
            users[username] = user
        finance = Group.objects.filter(name="finance").first()
        if finance is not None:
            users["fiona"].groups.add(finance)
        return users

    def _grants(self) -> None:
        """acme may submit `production` jobs (a restricted class); globex's are refused."""
        production = PriorityClass.objects.filter(name="production", restricted=True).first()
        if production is not None:
            PriorityGrant.objects.get_or_create(org=Organization.objects.get(slug="acme"),
                                                priority_class=production)

    def _tenants(self, users: dict[str, Any]) -> None:
        now = timezone.now()
        for slug, (name, projects, members) in ORGS.items():
            org, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": name})
            OrgMembership.objects.get_or_create(
                org=org, user=users[members[0]], defaults={"role": OrgRole.OWNER}
            )
            for project_slug, project_name in projects:
                project, _ = Project.objects.get_or_create(
                    org=org, slug=project_slug, defaults={"name": project_name}
                )
                for username in members:
                    Membership.objects.get_or_create(project=project, user=users[username])
            grants = [
                # reference, kind, source, credits, expires in days, project
                (f"{slug}-purchase-1", BucketKind.PAID, BucketSource.PURCHASE, 5_000, None, None),
                (f"{slug}-grant-q4", BucketKind.PAID, BucketSource.GRANT, 1_000, 90, None),
                (f"{slug}-promo-welcome", BucketKind.PROMOTIONAL, BucketSource.PROMOTION, 300, 6, None),
                (f"{slug}-promo-research", BucketKind.PROMOTIONAL, BucketSource.PROMOTION, 500, 25,
                 org.projects.order_by("id").first()),
            ]
            for reference, kind, source, credits, days, project in grants:
                if Bucket.objects.filter(org=org, reference=reference).exists():
                    continue  # dates are relative to the first run; a re-run keeps them
                issue_credits(
                    org=org,
                    project=project,
                    amount=credits * MICRO,
                    kind=kind,
                    source=source,
                    reference=reference,
                    reason="Demo data",
                    effective_at=now - timedelta(days=1),
                    expires_at=now + timedelta(days=days) if days else None,
                    actor=users["fiona"],
                )
