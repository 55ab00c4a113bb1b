"""Hypothesis drives the ledger services at random against a small pure reference model."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from django.db.models import Sum
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from config.clock import db_now
from ledger.clock import shifted
from ledger.errors import CaptureExceedsHold, HoldNotActive, InsufficientCredits
from ledger.models import Bucket, BucketKind, Hold, LedgerTransaction, Posting
from ledger.services import (
    capture,
    expire_due_buckets,
    extend_hold,
    issue_credits,
    place_hold,
    release_hold,
    release_partial,
    settle_hold,
)
from ledger.verification import verify_ledger
from tests.factories import OrganizationFactory


@dataclass
class RefBucket:
    id: int
    promo: bool
    expires: int | None  # hours after the base instant
    available: int
    held: int = 0
    spent: int = 0
    expired: int = 0

    def order(self) -> tuple[object, ...]:
        return (self.expires is None, self.expires or 0, not self.promo, self.id)


@dataclass
class RefHold:
    lines: dict[int, list[int]] = field(default_factory=dict)  # bucket -> [authorized, captured, released]
    active: bool = True

    def remaining(self) -> int:
        return sum(a - c - r for a, c, r in self.lines.values())


class LedgerMachine(RuleBasedStateMachine):
    holds = Bundle("holds")

    def __init__(self) -> None:
        super().__init__()
        self.org = OrganizationFactory()
        self.base: datetime = db_now()  # constant: the whole test is one DB transaction
        self.hours = 0
        self.buckets: dict[int, RefBucket] = {}
        self.ref_holds: dict[int, RefHold] = {}
        self.n = 0

    def key(self) -> str:
        self.n += 1
        return f"k{self.n}"

    def clock(self) -> shifted:
        return shifted(timedelta(hours=self.hours))

    def expired(self, b: RefBucket) -> bool:
        return b.expires is not None and b.expires <= self.hours

    def spend(self, amount: int) -> dict[int, int] | None:
        plan, left = {}, amount
        for b in sorted(self.buckets.values(), key=RefBucket.order):
            if left and b.available and not self.expired(b):
                take = min(left, b.available)
                plan[b.id], left = take, left - take
        return None if left else plan

    def hold_funds(self, ref: RefHold, plan: dict[int, int]) -> None:
        for bid, take in plan.items():
            self.buckets[bid].available -= take
            self.buckets[bid].held += take
            ref.lines.setdefault(bid, [0, 0, 0])[0] += take

    def ordered_lines(self, ref: RefHold) -> list[int]:
        return sorted(ref.lines, key=lambda bid: self.buckets[bid].order())

    def ref_capture(self, ref: RefHold, amount: int) -> None:
        for bid in self.ordered_lines(ref):
            a, c, r = ref.lines[bid]
            take = min(amount, a - c - r)
            ref.lines[bid][1] += take
            self.buckets[bid].held -= take
            self.buckets[bid].spent += take
            amount -= take

    def ref_release(self, ref: RefHold, amount: int) -> None:
        for bid in reversed(self.ordered_lines(ref)):
            a, c, r = ref.lines[bid]
            take = min(amount, a - c - r)
            ref.lines[bid][2] += take
            b = self.buckets[bid]
            b.held -= take
            if self.expired(b):
                b.expired += take
            else:
                b.available += take
            amount -= take

    @rule(amount=st.integers(1, 120), promo=st.booleans(), expires=st.sampled_from([None, 1, 2, 3]))
    def issue(self, amount: int, promo: bool, expires: int | None) -> None:
        expires = None if expires is None else self.hours + expires  # relative to the moved clock
        with self.clock():
            bucket = issue_credits(
                org=self.org, amount=amount, kind=BucketKind.PROMOTIONAL if promo else BucketKind.PAID,
                source="promotion" if promo else "purchase", reference=self.key(), reason="sm",
                effective_at=self.base - timedelta(hours=1),
                expires_at=None if expires is None else self.base + timedelta(hours=expires),
            )
        self.buckets[bucket.pk] = RefBucket(bucket.pk, promo, expires, amount)

    @rule(target=holds, amount=st.integers(1, 150))
    def hold(self, amount: int) -> int:
        plan = self.spend(amount)
        with self.clock():
            if plan is None:
                with pytest.raises(InsufficientCredits):
                    place_hold(org=self.org, amount=amount, key=self.key())
                return -1
            hold = place_hold(org=self.org, amount=amount, key=self.key())
        self.ref_holds[hold.pk] = ref = RefHold()
        self.hold_funds(ref, plan)
        return hold.pk

    def ref_of(self, hold_id: int) -> RefHold | None:
        return self.ref_holds.get(hold_id)  # None for a placement that was refused

    @rule(hold_id=holds, amount=st.integers(1, 60))
    def extend(self, hold_id: int, amount: int) -> None:
        if (ref := self.ref_of(hold_id)) is None:
            return
        plan = self.spend(amount)
        with self.clock():
            if not ref.active:
                with pytest.raises(HoldNotActive):
                    extend_hold(hold=Hold(pk=hold_id), amount=amount, key=self.key())
            elif plan is None:
                with pytest.raises(InsufficientCredits):
                    extend_hold(hold=Hold(pk=hold_id), amount=amount, key=self.key())
            else:
                extend_hold(hold=Hold(pk=hold_id), amount=amount, key=self.key())
                self.hold_funds(ref, plan)

    def _partial(self, fn, apply, hold_id: int, amount: int) -> None:  # type: ignore[no-untyped-def]
        if (ref := self.ref_of(hold_id)) is None:
            return
        key = self.key()
        with self.clock():
            if not ref.active:
                with pytest.raises(HoldNotActive):
                    fn(hold=Hold(pk=hold_id), amount=amount, key=key)
            elif amount > ref.remaining():
                with pytest.raises(CaptureExceedsHold):
                    fn(hold=Hold(pk=hold_id), amount=amount, key=key)
            else:
                first = fn(hold=Hold(pk=hold_id), amount=amount, key=key)
                apply(ref, amount)
                # A retry with the same key changes nothing and returns the same transaction.
                assert fn(hold=Hold(pk=hold_id), amount=amount, key=key).pk == first.pk

    @rule(hold_id=holds, amount=st.integers(1, 80))
    def capture(self, hold_id: int, amount: int) -> None:
        self._partial(capture, self.ref_capture, hold_id, amount)

    @rule(hold_id=holds, amount=st.integers(1, 80))
    def release_some(self, hold_id: int, amount: int) -> None:
        self._partial(release_partial, self.ref_release, hold_id, amount)

    @rule(hold_id=holds)
    def release(self, hold_id: int) -> None:
        if (ref := self.ref_of(hold_id)) is None:
            return
        with self.clock():
            if not ref.active:
                with pytest.raises(HoldNotActive):
                    release_hold(hold=Hold(pk=hold_id))
                return
            release_hold(hold=Hold(pk=hold_id))
        self.ref_release(ref, ref.remaining())
        ref.active = False

    @rule(hold_id=holds, total=st.integers(0, 200))
    def settle(self, hold_id: int, total: int) -> None:
        if (ref := self.ref_of(hold_id)) is None:
            return
        with self.clock():
            settle_hold(hold=Hold(pk=hold_id), capture_total=total, reason="sm")
        if ref.active:
            captured = sum(c for _, c, _ in ref.lines.values())
            self.ref_capture(ref, max(0, min(total - captured, ref.remaining())))
            self.ref_release(ref, ref.remaining())
            ref.active = False

    @rule()
    def expire(self) -> None:
        with self.clock():
            expire_due_buckets()
        for b in self.buckets.values():
            if self.expired(b) and b.available:
                b.expired += b.available
                b.available = 0

    @rule(hours=st.integers(1, 2))
    def tick(self, hours: int) -> None:
        self.hours += hours

    @invariant()
    def balances_match_the_model(self) -> None:
        for row in Bucket.objects.filter(org=self.org).values("pk", "available", "held", "spent", "expired"):
            ref = self.buckets[row["pk"]]
            assert (row["available"], row["held"], row["spent"], row["expired"]) == (
                ref.available, ref.held, ref.spent, ref.expired
            ), row
        for hold in Hold.objects.filter(org=self.org):
            ref = self.ref_holds[hold.pk]
            assert hold.remaining == ref.remaining()
            assert (hold.state == "active") == ref.active

    @invariant()
    def every_transaction_sums_to_zero(self) -> None:
        unbalanced = (
            Posting.objects.filter(org_id=self.org.pk).values("transaction_id")
            .annotate(s=Sum("amount")).exclude(s=0)
        )
        assert not unbalanced.exists()
        assert LedgerTransaction.objects.filter(org=self.org).count() >= len(self.buckets)


@pytest.mark.django_db
def test_ledger_state_machine() -> None:
    run_state_machine_as_test(
        LedgerMachine,
        settings=settings(
            max_examples=30, stateful_step_count=30, deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    assert verify_ledger() == []
