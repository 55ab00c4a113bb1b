"""Ledger test helpers: GPU types, an org, and a check that the journal matches the bucket cache."""

from __future__ import annotations

import pytest
from django.db.models import Sum

from accounts.models import Organization
from ledger.models import Account, Bucket, LedgerTransaction, Posting
from tests.factories import GpuTypeFactory, OrganizationFactory


@pytest.fixture
def gpu_types() -> None:
    for name, memory in (("H100", 80), ("A100", 40), ("L4", 24)):
        GpuTypeFactory(name=name, memory_gb=memory)


@pytest.fixture
def org() -> Organization:
    return OrganizationFactory()


def assert_journal_consistent() -> None:
    """Every transaction sums to zero; every bucket's cached columns equal its postings."""
    for txn in LedgerTransaction.objects.all():
        assert sum(p.amount for p in txn.postings.all()) == 0, txn
    for bucket in Bucket.objects.all():
        sums = dict(
            Posting.objects.filter(bucket=bucket).values_list("account").annotate(s=Sum("amount"))
        )
        assert sums.get(Account.BUCKET_AVAILABLE, 0) == bucket.available, bucket
        assert sums.get(Account.BUCKET_HELD, 0) == bucket.held, bucket
        assert bucket.available >= 0 and bucket.held >= 0
