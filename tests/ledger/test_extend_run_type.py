"""`extend_hold(run_type=...)` (review of 76034b5): idempotent by its parameters, the hold's own
buckets drawn before credits restricted to the run's type."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.errors import IdempotencyConflict
from ledger.models import BucketKind
from ledger.services import extend_hold, place_hold
from tests.factories import fund

pytestmark = pytest.mark.django_db


def _lines(hold) -> dict[int, int]:
    return {ln.bucket_id: ln.authorized for ln in hold.lines.all()}


def test_a_replay_of_an_extension_with_another_run_type_is_a_conflict(org, gpu_types) -> None:
    """docs/ledger.md, Idempotency: same key and different parameters -> IdempotencyConflict. The
    extension's journal params are {"amount"} only, so a replay for run_type H100 of a key that
    narrowed the hold to A100 (A100-only credits on its lines) is answered as done."""
    fund(org, 10)
    fund(org, 100, gpu_types=("A100",))
    hold = place_hold(org=org, amount=8, key="h", gpu_types=["A100", "H100"])
    extend_hold(hold=hold, amount=5, key="k", run_type="A100")
    hold.refresh_from_db()
    assert hold.gpu_types == ["A100"]
    with pytest.raises(IdempotencyConflict):
        extend_hold(hold=hold, amount=5, key="k", run_type="H100")


def test_an_extension_draws_the_holds_own_buckets_before_restricted_ones(org, gpu_types) -> None:
    """docs/ledger.md: "The hold's own buckets (for all its types) are drawn first; only when they
    fall short are credits restricted to T drawn". `_hold_funds` re-allocates over all locked
    buckets in spend order, so an A100-only promotional (or sooner-expiring) bucket pays the whole
    extension while the hold's own unrestricted credits stay available."""
    anywhere = fund(org, 10)
    a100 = fund(org, 100, gpu_types=("A100",), kind=BucketKind.PROMOTIONAL,
                expires_at=timezone.now() + timedelta(days=10))
    hold = place_hold(org=org, amount=8, key="h", gpu_types=["A100", "H100"])  # 2 left unrestricted
    extend_hold(hold=hold, amount=5, key="k", run_type="A100")
    hold.refresh_from_db()
    assert _lines(hold) == {anywhere.pk: 10, a100.pk: 3}, _lines(hold)
