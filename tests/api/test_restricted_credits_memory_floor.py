"""Review of 76034b5: the 402 "suggests only types that could run the job", but its fallback (types
outside the job's own) ignores the job's per-GPU memory floor: an 80 GB job is told to submit with
gpu_types ["L4"] (24 GB), which is then refused 400."""

from __future__ import annotations

import pytest

from ledger.models import MICRO
from tests.api.factories import make_tenant
from tests.factories import fund

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("in_sql", [True, False])
def test_a_402_does_not_suggest_a_type_below_the_jobs_memory_floor(
    fleet: dict, settings: object, in_sql: bool,
) -> None:
    from tests.api.conftest import client_for
    from tests.api.test_jobs_submit import post

    settings.JOBS_SUBMIT_IN_SQL = in_sql  # type: ignore[attr-defined]
    tenant = make_tenant()
    fund(tenant.org, 10 * MICRO, gpu_types=("L4",))
    api = client_for(tenant.user)
    body = {"project": tenant.project.pk, "name": "t", "gpu_types": ["H100"], "gpu_count": 1,
            "gpu_memory_gb": 80, "max_wall_seconds": 3600, "priority_class": "standard"}
    refused = post(api, body)
    assert refused.status_code == 402, refused.json()
    detail = refused.json()["detail"]
    suggested = post(api, {**body, "gpu_types": ["L4"]})
    assert 'gpu_types ["L4"]' not in detail or suggested.status_code == 201, (
        f"402 says: {detail!r}; following it: {suggested.status_code} {suggested.json()}")
