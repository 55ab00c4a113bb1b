"""verify_chains catches every way of breaking a chain (mutation testing round 2)."""

from collections.abc import Iterator

import pytest
from django.db import connection

from audit.models import AuditEvent
from audit.services import record
from audit.verification import verify_chains

pytestmark = pytest.mark.django_db


def _bypassing_trigger(sql: str, params: list) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_event_append_only")
        cursor.execute(sql, params)
        cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_event_append_only")


@pytest.fixture
def chain() -> Iterator[list[AuditEvent]]:
    yield [
        record(action=f"ledger.a{i}", subject_type="bucket", subject_id=i, org_id=61, amount=i)
        for i in range(1, 4)
    ]


def test_deleted_middle_event_is_reported_as_gap_and_broken_link(chain: list[AuditEvent]) -> None:
    _bypassing_trigger("DELETE FROM audit_auditevent WHERE id = %s", [chain[1].pk])
    where = f"chain org:61 seq 3 (event {chain[2].pk})"
    assert verify_chains() == [
        f"{where}: expected seq 2",
        f"{where}: prev_hash does not match the previous event's hash",
    ]


def test_deleted_last_event_is_reported_by_the_head(chain: list[AuditEvent]) -> None:
    _bypassing_trigger("DELETE FROM audit_auditevent WHERE id = %s", [chain[2].pk])
    assert verify_chains() == ["chain org:61: head does not point at its last event (seq 2)"]


def test_whole_chain_deleted_is_reported_by_the_head(chain: list[AuditEvent]) -> None:
    _bypassing_trigger("DELETE FROM audit_auditevent WHERE chain = %s", ["org:61"])
    assert verify_chains() == ["chain org:61: head at seq 3 but the chain has no events"]


def test_swapped_events_are_reported(chain: list[AuditEvent]) -> None:
    # Reorder: give events 2 and 3 each other's seq (a rewrite that keeps every seq present).
    _bypassing_trigger("UPDATE audit_auditevent SET seq = -seq WHERE id IN (%s, %s)",
                       [chain[1].pk, chain[2].pk])
    _bypassing_trigger("UPDATE audit_auditevent SET seq = 3 WHERE id = %s", [chain[1].pk])
    _bypassing_trigger("UPDATE audit_auditevent SET seq = 2 WHERE id = %s", [chain[2].pk])
    problems = verify_chains()
    assert f"chain org:61 seq 2 (event {chain[2].pk}): content does not match its hash" in problems
    assert f"chain org:61 seq 3 (event {chain[1].pk}): content does not match its hash" in problems
    assert any("prev_hash does not match" in p for p in problems)


def test_relinked_event_is_reported(chain: list[AuditEvent]) -> None:
    # Skip a link: event 3 rewritten to point at event 1 (its own hash then no longer matches).
    _bypassing_trigger("UPDATE audit_auditevent SET prev_hash = %s WHERE id = %s",
                       [chain[0].hash, chain[2].pk])
    where = f"chain org:61 seq 3 (event {chain[2].pk})"
    assert verify_chains() == [
        f"{where}: prev_hash does not match the previous event's hash",
        f"{where}: content does not match its hash",
    ]


@pytest.mark.parametrize(
    ("column", "value"),
    [("actor_id", "someone"), ("action", "ledger.other"), ("subject_type", "hold"), ("org_id", 62),
     ("reason_code", "forged"), ("request_id", "req-forged"), ("data", '{"x": 1}'),
     ("actor_type", "user"), ("created_at", "2030-01-01T00:00:00Z")],
)
def test_every_hashed_column_is_covered(chain: list[AuditEvent], column: str, value: object) -> None:
    cast = "::jsonb" if column == "data" else ""
    _bypassing_trigger(f"UPDATE audit_auditevent SET {column} = %s{cast} WHERE id = %s",  # noqa: S608
                       [value, chain[0].pk])
    assert verify_chains() == [f"chain org:61 seq 1 (event {chain[0].pk}): content does not match its hash"]


def test_other_chains_are_not_blamed(chain: list[AuditEvent]) -> None:
    other = record(action="ledger.issue", subject_type="bucket", subject_id=9, org_id=63)
    _bypassing_trigger("UPDATE audit_auditevent SET amount = 99 WHERE id = %s", [other.pk])
    assert verify_chains() == [f"chain org:63 seq 1 (event {other.pk}): content does not match its hash"]
