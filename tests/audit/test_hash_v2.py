"""Hash format 2: computed by PostgreSQL (`audit_append_v2`), verified in Python alongside format 1."""

import pytest
from django.db import connection

from audit.chain import HASH_V1, HASH_V2, event_digest_v2, jsonb_text
from audit.models import AuditEvent
from audit.services import content_fields, record
from audit.verification import verify_chains

pytestmark = pytest.mark.django_db

SAMPLES = [
    {},
    [],
    {"b": 1, "a": 2, "aa": [1, "x", None, True, False], "": {"z": {}, "y": []}},
    {"transaction": 12, "key": "hold:job:7:submit", "buckets": {"10": 5, "9": 7, "100": 1}},
    {"reason": 'quote " backslash \\ tab \t newline \n cr \r bell \x07 del \x7f', "ü": "ünïcødé 😀 ☃"},
    {"n": -123456789012345678, "f": 0.5, "g": 1.0, "h": 1e-07, "i": 2.5e20, "j": -0.001},
    {"long key before short": 1, "k": 2, "kk": 3, "Ka": 4, "ka": 5, "é": 6, "ab": 7},
    ["nested", [{"x": [1, {"y": "z"}]}]],
]


@pytest.mark.parametrize("value", SAMPLES)
def test_jsonb_text_matches_postgres(value) -> None:
    import json

    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb::text", [json.dumps(value)])
        (text,) = cursor.fetchone()
    assert jsonb_text(value) == text


def _append_v2(org_id, *, data, amount=5, subject_id="1") -> AuditEvent:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT audit_append_v2(%s, 'user', '3', 'ledger.test', 'ledger.hold', %s, %s, 'test', "
            "%s::jsonb, 'req-1')",
            [org_id, subject_id, amount, __import__("json").dumps(data)],
        )
        (pk,) = cursor.fetchone()
    return AuditEvent.objects.get(pk=pk)


def test_v2_events_chain_with_v1_events_and_verify() -> None:
    first = record(action="ledger.issue", subject_type="bucket", subject_id=1, org_id=41, amount=3)
    second = _append_v2(41, data={"reason": "ünïcødé \"q\" \n", "buckets": {"10": 5, "9": 2}})
    third = record(action="ledger.issue", subject_type="bucket", subject_id=2, org_id=41)
    fourth = _append_v2(None, data={})  # the system chain, created by the SQL function
    assert (first.hash_format, second.hash_format, fourth.hash_format) == (HASH_V1, HASH_V2, HASH_V2)
    assert AuditEvent.objects.get(pk=third.pk).hash_format == HASH_V1
    assert (second.seq, second.prev_hash, second.chain) == (2, first.hash, "org:41")
    assert (third.seq, third.prev_hash) == (3, second.hash)
    assert (fourth.chain, fourth.seq) == ("system", 1)
    assert second.hash == event_digest_v2(
        prev_hash=first.hash, chain="org:41", seq=2, fields=content_fields(second)
    )
    assert verify_chains() == []


@pytest.mark.parametrize(
    ("column", "value"),
    [("amount", 6), ("data", '{"reason": "x", "buckets": {"10": 6}}'), ("subject_id", "2"),
     ("created_at", "2030-01-01T00:00:00Z"), ("hash_format", 1)],
)
def test_tampered_v2_event_is_reported(column: str, value) -> None:
    event = _append_v2(42, data={"reason": "x", "buckets": {"10": 5}})
    _append_v2(42, data={})
    cast = "::jsonb" if column == "data" else ""
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_event_append_only")
        cursor.execute(f"UPDATE audit_auditevent SET {column} = %s{cast} WHERE id = %s",  # noqa: S608
                       [value, event.pk])
        cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_event_append_only")
    assert verify_chains() == [f"chain org:42 seq 1 (event {event.pk}): content does not match its hash"]


def test_unknown_hash_format_is_reported() -> None:
    event = _append_v2(43, data={})
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE audit_auditevent DISABLE TRIGGER audit_event_append_only")
        cursor.execute("UPDATE audit_auditevent SET hash_format = 9 WHERE id = %s", [event.pk])
        cursor.execute("ALTER TABLE audit_auditevent ENABLE TRIGGER audit_event_append_only")
    assert verify_chains() == [f"chain org:43 seq 1 (event {event.pk}): content does not match its hash"]
