"""The PostgreSQL hot path (ledger_place_hold / ledger_capture / ledger_release_hold) writes what
the Python decision path writes, refuses with the same typed errors, and leaves nothing behind."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from audit.verification import verify_chains
from ledger.clock import shifted
from ledger.errors import CaptureExceedsHold, HoldNotActive, IdempotencyConflict, InsufficientCredits
from ledger.models import BucketKind, Hold, HoldLine, LedgerTransaction
from ledger.services import CallerEvent, _sql, capture, place_hold, release_hold
from ledger.verification import verify_ledger
from tests.factories import OrganizationFactory, UserFactory, fund
from tests.ledger.conftest import assert_journal_consistent


def _scenario(org) -> list[Any]:
    """Every outcome of the three hot-path services, recorded as comparable values."""
    now = timezone.now()
    user = UserFactory()
    fund(org, 10, kind=BucketKind.PROMOTIONAL, expires_at=now + timedelta(days=1))
    fund(org, 100)
    fund(org, 20, expires_at=now + timedelta(days=3))
    out: list[Any] = []
    h1 = place_hold(org=org, amount=50, key="h1", actor=user)
    out.append(("h1", h1.authorized, h1.state, h1.remaining))
    t = capture(hold=h1, amount=25, key="c", reason="usage")
    out.append(("capture", t.kind, t.amount, t.params, t.memo))
    assert capture(hold=h1, amount=25, key="c").pk == t.pk  # replay
    with pytest.raises(IdempotencyConflict):
        capture(hold=h1, amount=26, key="c")
    with pytest.raises(CaptureExceedsHold) as exceeds:
        capture(hold=h1, amount=26, key="d")
    out.append(("exceeds", exceeds.value.requested, exceeds.value.remaining))
    with shifted(timedelta(days=2)):  # the promotional bucket has expired: its part goes to expiry
        settled = release_hold(hold=h1, reason="done")
    out.append(("released", settled.state, settled.released, settled.captured, settled.remaining))
    with pytest.raises(HoldNotActive):
        release_hold(hold=h1)
    with pytest.raises(HoldNotActive):
        capture(hold=h1, amount=1, key="late")
    event = CallerEvent(action="sched.job.submit", subject_type="job", subject_id=77,
                        reason_code="submitted", data={"project": 1, "ledger": "overridden"})
    h2 = place_hold(org=org, amount=30, key="h2", reference="job:77", audit_as=event, actor=user)
    assert place_hold(org=org, amount=30, key="h2", reference="job:77").pk == h2.pk  # replay
    with pytest.raises(IdempotencyConflict):
        place_hold(org=org, amount=31, key="h2", reference="job:77")
    with pytest.raises(InsufficientCredits) as short:
        place_hold(org=org, amount=10_000, key="h3")
    out.append(("short", short.value.needed, short.value.available))
    assert not Hold.objects.filter(org=org, key="h3").exists()
    released = release_hold(hold=h2, key="k", actor="scheduler")
    assert release_hold(hold=h2, key="k").state == released.state  # replay
    with pytest.raises(HoldNotActive):
        release_hold(hold=h2, key="other")  # a new key for a settled hold
    out.append(("h2", released.state, released.released))
    with pytest.raises(Hold.DoesNotExist):
        capture(hold=Hold(pk=10**9), amount=1, key="x")
    return out


def _normalized(org) -> dict[str, Any]:
    def index(queryset) -> dict[int, int]:
        return {pk: i for i, pk in enumerate(queryset.order_by("pk").values_list("pk", flat=True))}

    buckets = index(org.buckets.all())
    holds = index(Hold.objects.filter(org=org))
    txns = index(LedgerTransaction.objects.filter(org=org))

    def key(text: str) -> str:
        return re.sub(r"^(capture|release|extend):(\d+):", lambda m: f"{m[1]}:H{holds[int(m[2])]}:", text)

    journal = [
        (t.kind, key(t.key), t.amount, t.params, t.memo, None if t.hold_id is None else holds[t.hold_id],
         [(p.account, None if p.bucket_id is None else buckets[p.bucket_id], p.amount)
          for p in t.postings.order_by("pk")])
        for t in LedgerTransaction.objects.filter(org=org).exclude(kind="issue").order_by("pk")
    ]
    lines = sorted((holds[ln.hold_id], buckets[ln.bucket_id], ln.authorized, ln.captured, ln.released)
                   for ln in HoldLine.objects.filter(hold__org=org))
    columns = [(b.available, b.held, b.spent, b.expired, b.voided) for b in org.buckets.order_by("pk")]
    hold_rows = [(h.state, h.authorized, h.captured, h.released, h.settled_at is not None, h.reference,
                  h.user_id is not None) for h in Hold.objects.filter(org=org).order_by("pk")]

    def data(d: dict[str, Any]) -> dict[str, Any]:
        d = dict(d)
        if "transaction" in d:
            d["transaction"] = txns[d["transaction"]]
        if "key" in d:
            d["key"] = key(d["key"])
        if "hold" in d:
            d["hold"] = holds[d["hold"]]
        if "buckets" in d:
            d["buckets"] = {buckets[int(b)]: v for b, v in d["buckets"].items()}
        return d

    events = [
        (e.action, e.subject_type,
         holds[int(e.subject_id)] if e.subject_type == "ledger.hold" else e.subject_id,
         e.actor_type, bool(e.actor_id), e.amount, e.reason_code, data(e.data))
        for e in AuditEvent.objects.filter(org_id=org.pk).exclude(action="ledger.issue").order_by("seq")
    ]
    return {"journal": journal, "lines": lines, "columns": columns, "holds": hold_rows, "events": events}


@pytest.mark.django_db
def test_sql_path_writes_what_the_python_path_writes(monkeypatch) -> None:
    results = {}
    for enabled in (False, True):
        monkeypatch.setattr(_sql, "ENABLED", enabled)
        org = OrganizationFactory()
        outcomes = _scenario(org)
        results[enabled] = (outcomes, _normalized(org))
    for part in ("journal", "lines", "columns", "holds", "events"):
        assert results[True][1][part] == results[False][1][part], part
    assert results[True][0] == results[False][0]
    assert_journal_consistent()
    assert verify_ledger() == []
    assert verify_chains() == []
    formats = set(AuditEvent.objects.exclude(action="ledger.issue").values_list("hash_format", flat=True))
    assert formats == {1, 2}  # the Python path's events (format 1) and the SQL path's (format 2)


@pytest.mark.django_db(transaction=True)
def test_outermost_calls_are_one_statement_each_and_refusals_leave_nothing() -> None:
    from django.test.utils import CaptureQueriesContext

    assert _sql.ENABLED and connection.vendor == "postgresql"
    org = OrganizationFactory()
    fund(org, 100)
    with CaptureQueriesContext(connection) as queries:
        hold = place_hold(org=org, amount=60, key="a")
        capture(hold=hold, amount=10, key="c")
        release_hold(hold=hold)
    assert len(queries) == 3  # no BEGIN/COMMIT round trips: each call is its own transaction
    with connection.cursor() as cursor:  # and each is a server-side prepared statement
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = " ".join(row[0] for row in cursor.fetchall())
    for function in ("ledger_place_hold", "ledger_capture", "ledger_release_hold"):
        assert function in prepared
    events = AuditEvent.objects.filter(org_id=org.pk).count()
    with pytest.raises(InsufficientCredits) as short:
        place_hold(org=org, amount=101, key="b")
    assert (short.value.needed, short.value.available) == (101, 90)
    assert not Hold.objects.filter(org=org, key="b").exists()
    assert AuditEvent.objects.filter(org_id=org.pk).count() == events
    assert verify_ledger() == [] and verify_chains() == []
