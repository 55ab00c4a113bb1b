"""Review of 0980b4e: the unlocked `spendable_by_gpu_types` read chooses the hold's types before the
buckets are locked. A concurrent submission that spends the unrestricted credits between that read
and the lock makes a job refused 402 although, under the locks, the A100-restricted credits could
pay for it (the same job submitted a moment later is accepted, held on ["A100"]). The Python path
is what held submissions and those with dependencies always take (and every one with
JOBS_SUBMIT_IN_SQL off)."""

from __future__ import annotations

import threading

import pytest
from django.db import transaction

from ledger.errors import InsufficientCredits
from ledger.models import MICRO
from scheduling.services.submission import JobSpec, submit_job
from tests.api.conftest import A100_PRICE, H100_PRICE
from tests.api.factories import make_tenant
from tests.factories import fund
from tests.lock_waits import another_session_waits
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def spec(name: str) -> JobSpec:
    return JobSpec(name=name, gpu_types=("H100", "A100"), gpu_count=1, max_wall_seconds=3600,
                   priority_class="standard", held=True)  # held: always the Python path


def test_a_concurrent_spend_of_the_unrestricted_credits_does_not_refuse_a_job_restricted_credits_pay_for(
    fleet: dict,
) -> None:
    tenant = make_tenant()
    fund(tenant.org, H100_PRICE)  # unrestricted: one H100 hour
    fund(tenant.org, 10 * MICRO, gpu_types=("A100",))  # restricted: four A100 hours
    first_placed, commit_first = threading.Event(), threading.Event()

    def first() -> int:
        with transaction.atomic():
            job = submit_job(user=tenant.user, project=tenant.project, spec=spec("first"),
                             idempotency_key="k1")
            first_placed.set()
            assert commit_first.wait(20)
        return job.pk

    def second() -> list[str]:
        assert first_placed.wait(20)
        with transaction.atomic():
            job = submit_job(user=tenant.user, project=tenant.project, spec=spec("second"),
                             idempotency_key="k2")
        return list(job.current_hold.gpu_types)

    one = Worker(first).start()
    two = Worker(second).start()
    try:
        assert first_placed.wait(20)
        # The second has read the spendable credits (the first's hold not committed) and now
        # waits for the unrestricted bucket's lock.
        assert another_session_waits(two.done), two.errors
    finally:
        commit_first.set()
    one.join(), two.join()
    assert one.errors == []
    refused = [e for e in two.errors if isinstance(e, InsufficientCredits)]
    assert not refused, (
        f"refused although {A100_PRICE} of A100-restricted credits could hold it: "
        f"{refused[0].detail}"
    )
    assert two.result == ["A100"]
