"""`run_once` / `_run` directly: what "the same request" means, replay, refusal, TTL
(mutation testing round 2)."""

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection

from accounts.models import IdempotencyRecord
from config.api.errors import IdempotencyKeyReused
from config.api.idempotency import fingerprint, run_once

pytestmark = pytest.mark.django_db


class Effect:
    def __init__(self, status: int = 201, body: Any = None) -> None:
        self.calls = 0
        self.status, self.body = status, body

    def __call__(self) -> tuple[int, Any]:
        self.calls += 1
        return self.status, self.body if self.body is not None else {"call": self.calls}


def test_replay_returns_the_stored_status_and_body_without_running_again() -> None:
    effect = Effect(status=202)
    first = run_once(principal="form:1", key="k", body={"a": 1}, effect=effect, path="/p")
    again = run_once(principal="form:1", key="k", body={"a": 1}, effect=effect, path="/p")
    assert first == (202, {"call": 1}, False)
    assert again == (202, {"call": 1}, True)
    assert effect.calls == 1


@pytest.mark.parametrize(
    ("body", "path"), [({"a": 2}, "/p"), ({"a": 1, "b": 0}, "/p"), ({"a": 1}, "/q")],
)
def test_same_key_for_another_body_or_path_is_refused(body: dict, path: str) -> None:
    effect = Effect()
    run_once(principal="form:1", key="k", body={"a": 1}, effect=effect, path="/p")
    with pytest.raises(IdempotencyKeyReused):
        run_once(principal="form:1", key="k", body=body, effect=effect, path=path)
    assert effect.calls == 1


def test_keys_are_scoped_by_principal() -> None:
    effect = Effect()
    first = run_once(principal="form:1", key="k", body={"a": 1}, effect=effect, path="/p")
    other = run_once(principal="form:2", key="k", body={"a": 1}, effect=effect, path="/p")
    assert first == (201, {"call": 1}, False)
    assert other == (201, {"call": 2}, False)  # ran for the other principal, not a replay
    assert IdempotencyRecord.objects.filter(key="k").count() == 2


def test_fingerprint_covers_method_path_and_body() -> None:
    base = fingerprint("POST", "/p", {"a": 1})
    assert fingerprint("post", "/p", {"a": 1}) == base
    assert len({base, fingerprint("PUT", "/p", {"a": 1}), fingerprint("POST", "/q", {"a": 1}),
                fingerprint("POST", "/p", {"a": 2}), fingerprint("POST", "/p", {})}) == 5


def test_failed_effect_leaves_no_record_and_the_key_can_be_retried() -> None:
    def boom() -> tuple[int, Any]:
        raise RuntimeError("effect failed")

    with pytest.raises(RuntimeError):
        run_once(principal="form:1", key="k", body={}, effect=boom, path="/p")
    assert not IdempotencyRecord.objects.filter(key="k").exists()
    assert run_once(principal="form:1", key="k", body={}, effect=Effect(), path="/p")[2] is False


def test_record_is_done_and_expires_after_the_configured_ttl(settings: Any) -> None:
    settings.IDEMPOTENCY_KEY_TTL_SECONDS = 7200
    run_once(principal="form:1", key="k", body={}, effect=Effect(body={"x": 1}), path="/p")
    record = IdempotencyRecord.objects.get(key="k")
    assert record.state == "done" and record.response_status == 201 and record.response_body == {"x": 1}
    assert record.expires_at - record.created_at == timedelta(seconds=7200)


def test_in_flight_record_is_refused_not_replayed() -> None:
    from config.api.errors import IdempotencyKeyInFlight

    fp = fingerprint("POST", "/p", {})
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO accounts_idempotencyrecord "
            "(principal, key, fingerprint, state, created_at, expires_at) "
            "VALUES ('form:1', 'k', %s, 'in_flight', now(), now() + interval '1 day')", [fp])
    effect = Effect()
    with pytest.raises(IdempotencyKeyInFlight):
        run_once(principal="form:1", key="k", body={}, effect=effect, path="/p")
    assert effect.calls == 0
