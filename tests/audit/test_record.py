"""Audit events chain by hash and cannot be changed at the database."""

import pytest
from django.db import DatabaseError, transaction

from audit.chain import event_digest
from audit.models import AuditEvent
from audit.services import content_fields, record


@pytest.mark.django_db
def test_events_chain_per_org() -> None:
    first = record(action="ledger.issue", subject_type="bucket", subject_id=1, org_id=7, amount=5)
    second = record(action="ledger.hold", subject_type="hold", subject_id=2, org_id=7, amount=3)
    other = record(action="ledger.issue", subject_type="bucket", subject_id=3, org_id=8)
    assert (first.chain, first.seq) == ("org:7", 1)
    assert (second.seq, second.prev_hash) == (2, first.hash)
    assert (other.chain, other.seq) == ("org:8", 1)
    stored = AuditEvent.objects.get(pk=second.pk)
    assert stored.hash == event_digest(
        prev_hash=first.hash, chain="org:7", seq=2, fields=content_fields(stored)
    )


@pytest.mark.django_db
@pytest.mark.parametrize("change", ["update", "delete"])
def test_database_rejects_changes(change: str) -> None:
    event = record(action="ledger.issue", subject_type="bucket", subject_id=1, org_id=1)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        if change == "update":
            AuditEvent.objects.filter(pk=event.pk).update(amount=999)
        else:
            AuditEvent.objects.filter(pk=event.pk).delete()
    assert AuditEvent.objects.get(pk=event.pk).amount is None
