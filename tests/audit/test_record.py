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


@pytest.mark.django_db
def test_record_many_interleaves_with_record() -> None:
    from audit.services import NewEvent, record_many
    from audit.verification import verify_chains

    first = record(action="a", subject_type="s", subject_id=1, org_id=7)
    specs = [
        NewEvent(action="b", subject_type="s", subject_id=2, org_id=8),
        NewEvent(action="c", subject_type="s", subject_id=3, org_id=7, amount=4, data={"k": [1]}),
        NewEvent(action="d", subject_type="s", subject_id=4, org_id=None),
        NewEvent(action="e", subject_type="s", subject_id=5, org_id=7),
    ]
    assert record_many(specs) == 4
    events = [AuditEvent.objects.get(action=a) for a in "bcde"]
    assert [(e.chain, e.seq) for e in events] == [("org:8", 1), ("org:7", 2), ("system", 1), ("org:7", 3)]
    assert events[1].prev_hash == first.hash and events[3].prev_hash == events[1].hash
    last = record(action="f", subject_type="s", subject_id=6, org_id=7)
    assert (last.seq, last.prev_hash) == (4, events[3].hash)
    assert record_many([]) == 0
    assert verify_chains() == []
