"""Fixtures for API tests: a priced fleet, funded tenants, and clients authenticated by API key."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import OrgRole, Region
from accounts.services import create_api_key
from ledger.models import MICRO
from scheduling.models import GpuPrice, GpuType, Node, NodeState, PriorityClass
from tests.api.factories import Tenant, grant, make_tenant

# Prices per GPU-hour (micro-credits).
H100_PRICE = 4 * MICRO
A100_PRICE = 2_500_000
L4_PRICE = 800_000
PRIORITY_CLASSES = [("production", 500, False, True), ("premium", 400, True, True),
                    ("standard", 300, True, True), ("batch", 200, True, False),
                    ("interactive", 100, True, False)]


@pytest.fixture(autouse=True)
def _generous_rate_limits(settings: Any) -> None:
    # Functional tests must not trip the limiter; test_ratelimit.py lowers them on purpose.
    settings.API_RATE_LIMITS = {"default": {"key": "100000/minute", "org": "100000/minute"}}


@pytest.fixture
def fleet(db: Any) -> dict[str, GpuType]:
    since = timezone.now() - timedelta(days=1)
    types = {}
    for name, memory, price in (("H100", 80, H100_PRICE), ("A100", 40, A100_PRICE), ("L4", 24, L4_PRICE)):
        gpu, _ = GpuType.objects.get_or_create(name=name, defaults={"memory_gb": memory})
        GpuPrice.objects.get_or_create(gpu_type=gpu, effective_from=since,
                                       defaults={"price_per_gpu_hour": price})
        types[name] = gpu
    # Nodes big enough for any gang the API accepts (up to 1,024 GPUs) in both test regions: a
    # submission the fleet could never run is refused (400), and these tests are about the API.
    for code in ("eu", "us"):
        region, _ = Region.objects.get_or_create(code=code, defaults={"name": code})
        for name, gpu in types.items():
            Node.objects.get_or_create(name=f"{name}-{code}", defaults={
                "region": region, "gpu_type": gpu, "gpu_count": 1024, "state": NodeState.READY})
    # transaction=True tests flush the tables, including the classes a data migration created.
    for cls_name, rank, preemptible, can_preempt in PRIORITY_CLASSES:
        PriorityClass.objects.get_or_create(
            name=cls_name, defaults={"rank": rank, "preemptible": preemptible, "can_preempt": can_preempt,
                                     "restricted": cls_name == "production"}  # as migration 0025
        )
    return types


def client_for(user: Any) -> APIClient:
    _key, raw = create_api_key(user=user, name="test")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


@pytest.fixture
def tenant(fleet: dict[str, GpuType]) -> Tenant:
    """A funded org, granted the restricted `production` class (tests of the grant make their own)."""
    tenant = make_tenant(funds=1000 * MICRO)
    grant(tenant.org)
    return tenant


@pytest.fixture
def api(tenant: Tenant) -> APIClient:
    return client_for(tenant.user)


@pytest.fixture
def job_body(tenant: Tenant) -> Callable[..., dict[str, Any]]:
    def build(**overrides: Any) -> dict[str, Any]:
        body = {"project": tenant.project.pk, "name": "train", "gpu_types": ["H100", "A100"],
                "gpu_count": 2, "gpu_memory_gb": 40, "max_wall_seconds": 3600,
                "priority_class": "standard"}
        body.update(overrides)
        return body

    return build


__all__ = ["OrgRole", "client_for"]
