"""The dashboard WebSocket: session auth, per-viewer scope, pull on connect, push from beat."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore

from config.asgi import application
from portal.consumers import CLOSE_FORBIDDEN, CLOSE_UNAUTHENTICATED, pull_interval_seconds
from portal.tasks import broadcast_dashboard
from tests.portal.conftest import World

# Transactional: the consumer reads through database_sync_to_async, which closes connections that
# sit inside a test's atomic block.
pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = (b"origin", b"http://127.0.0.1")


def _session_cookie(user: Any) -> bytes:
    session = SessionStore()
    session[SESSION_KEY] = str(user.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = user.get_session_auth_hash()
    session.save()
    return f"{settings.SESSION_COOKIE_NAME}={session.session_key}".encode()


async def _communicator(user: Any | None) -> WebsocketCommunicator:
    headers = [ORIGIN]
    if user is not None:
        headers.append((b"cookie", await sync_to_async(_session_cookie)(user)))
    return WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)


def _two_messages(world: World) -> tuple[dict[str, Any], dict[str, Any]]:
    """The first two messages a finance viewer's socket receives (the second may be a pull: room
    for a slow snapshot build on a loaded machine; one CI run saw none within 5 s)."""

    async def scenario(world_async: World) -> tuple[dict[str, Any], dict[str, Any]]:
        communicator = await _communicator(world_async.carol)
        connected, _ = await communicator.connect()
        assert connected
        first = await communicator.receive_json_from(timeout=5)
        second = await communicator.receive_json_from(timeout=20)
        await communicator.disconnect()
        return first, second

    return async_to_sync(scenario)(world)


async def _assert_closed_with(communicator: WebsocketCommunicator, code: int) -> None:
    """Accepted, then closed with `code` (QA: a close before the handshake reached the browser as an
    HTTP 403 and code 1006, which the page cannot tell from a dropped connection)."""
    connected, _ = await communicator.connect()
    assert connected is True
    closed = await communicator.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": code}


def test_anonymous_is_rejected(world: World) -> None:
    async def scenario(world_async: World) -> None:
        communicator = await _communicator(None)
        await _assert_closed_with(communicator, CLOSE_UNAUTHENTICATED)

    async_to_sync(scenario)(world)


def test_a_refused_socket_answers_nothing_more(world: World) -> None:
    """Review: a refresh sent before the close arrived (the page sends one when its tab shows)
    built a whole dashboard snapshot for an anonymous client, then failed."""

    async def scenario(world_async: World) -> None:
        communicator = await _communicator(None)
        connected, _ = await communicator.connect()
        assert connected is True
        await communicator.send_json_to({"type": "refresh"})
        closed = await communicator.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": CLOSE_UNAUTHENTICATED}
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()  # raises what the consumer raised

    async_to_sync(scenario)(world)


def test_frames_that_are_not_json_text_are_ignored(world: World, settings: Any) -> None:
    """QA: a binary or malformed frame raised out of the consumer and dropped the socket."""
    settings.PORTAL_DASHBOARD_REFRESH_SECONDS = 0  # the refresh below follows the first snapshot at once

    async def scenario(world_async: World) -> None:
        communicator = await _communicator(world_async.carol)
        connected, _ = await communicator.connect()
        assert connected
        await communicator.receive_json_from(timeout=5)  # the first snapshot
        await communicator.send_to(text_data="not json")
        await communicator.send_to(bytes_data=b"\x00\x01")
        await communicator.send_to(text_data="[" * 100_000 + "]" * 100_000)  # past the parser's depth
        await communicator.send_json_to({"type": "refresh"})  # still served
        assert (await communicator.receive_json_from(timeout=5))["type"] == "snapshot"
        await communicator.disconnect()  # raises what the consumer raised

    async_to_sync(scenario)(world)


def test_plain_member_is_rejected(world: World) -> None:
    async def scenario(world_async: World) -> None:
        communicator = await _communicator(world_async.alice)
        await _assert_closed_with(communicator, CLOSE_FORBIDDEN)

    async_to_sync(scenario)(world)


def test_foreign_origin_is_rejected(world: World) -> None:
    async def scenario(world_async: World) -> None:
        cookie = await sync_to_async(_session_cookie)(world_async.carol)
        communicator = WebsocketCommunicator(
            application, "/ws/dashboard/", headers=[(b"origin", b"https://evil.example"), (b"cookie", cookie)]
        )
        connected, _ = await communicator.connect()
        assert connected is False

    async_to_sync(scenario)(world)


def test_finance_gets_a_snapshot_of_every_org_then_pushes(world: World) -> None:
    async def scenario(world_async: World) -> None:
        communicator = await _communicator(world_async.carol)
        connected, _ = await communicator.connect()
        assert connected
        first = await communicator.receive_json_from(timeout=5)
        snapshot = first["snapshot"]
        assert first["type"] == "snapshot"
        assert [job["id"] for job in snapshot["running_jobs"]] == [world_async.job.id]
        assert snapshot["gpu_types"] == [{"name": "H100", "gpus": 8, "allocated": 2, "utilization": 73.0}]
        assert [(row["org"], row["amount"]) for row in snapshot["consumption"]] == [("acme", 12_345_678)]
        assert snapshot["consumed_total_display"] == "12.345678"

        # The beat task's push reaches the open socket through the Redis channel layer.
        assert await sync_to_async(broadcast_dashboard)() is True
        pushed = await communicator.receive_json_from(timeout=5)
        assert pushed["type"] == "snapshot"
        assert pushed["snapshot"]["running_jobs"][0]["name"] == "train-resnet"
        await communicator.disconnect()

    async_to_sync(scenario)(world)


def test_org_owner_sees_only_their_org(world: World) -> None:
    async def scenario(world_async: World) -> None:
        communicator = await _communicator(world_async.bob)  # owner of globex, not of acme
        connected, _ = await communicator.connect()
        assert connected
        snapshot = (await communicator.receive_json_from(timeout=5))["snapshot"]
        assert snapshot["running_jobs"] == []
        assert snapshot["consumption"] == []
        assert snapshot["consumed_total"] == 0
        # Fleet capacity is shared information; other orgs' jobs and money are not.
        assert snapshot["gpu_types"][0]["allocated"] == 2
        await communicator.disconnect()

    async_to_sync(scenario)(world)


def test_consumer_pulls_when_no_push_arrives(world: World, settings: object) -> None:
    # The embedded mode's in-memory layer cannot carry the beat process's pushes: pull instead.
    settings.PORTAL_DASHBOARD_PULL_SECONDS = 0.2

    first, second = _two_messages(world)
    assert first["type"] == second["type"] == "snapshot"
    assert second["snapshot"]["generated_at"] >= first["snapshot"]["generated_at"]


def test_a_failed_pull_does_not_end_the_pulls(world: World, settings: object, monkeypatch: Any) -> None:
    """A build that raises (here the first pull after connecting) is logged and retried: it had
    ended the pull task silently, and the page stopped updating until it reconnected."""
    from portal import dashboard

    settings.PORTAL_DASHBOARD_PULL_SECONDS = 0.2
    real, calls = dashboard.build_snapshot, []

    def flaky() -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("the database went away")
        return real()

    monkeypatch.setattr(dashboard, "build_snapshot", flaky)

    first, second = _two_messages(world)
    assert first["type"] == second["type"] == "snapshot"
    assert len(calls) >= 3  # connect, the failed pull, the pull after it


@pytest.mark.parametrize("revoke", ["sign-out", "role"])
def test_an_open_socket_stops_streaming_once_its_viewer_may_no_longer_see(
    world: World, settings: object, revoke: str
) -> None:
    """QA: a socket kept streaming an org's figures after its viewer signed out (4401) or lost the
    role that let them see the dashboard (4403)."""
    from django.contrib.auth.models import Group

    settings.PORTAL_DASHBOARD_PULL_SECONDS = 0.2
    settings.PORTAL_DASHBOARD_RECHECK_SECONDS = 0

    def take_it_away() -> None:
        if revoke == "sign-out":
            SessionStore(session_key=keys[0]).delete()  # what logout's flush does
        else:
            world.carol.groups.remove(Group.objects.get(name="finance"))

    keys: list[str] = []

    async def scenario(world_async: World) -> None:
        cookie = await sync_to_async(_session_cookie)(world_async.carol)
        keys.append(cookie.decode().split("=", 1)[1])
        headers = [ORIGIN, (b"cookie", cookie)]
        communicator = WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        assert (await communicator.receive_json_from(timeout=5))["type"] == "snapshot"
        await sync_to_async(take_it_away)()
        closed = await communicator.receive_output(timeout=20)
        while closed["type"] == "websocket.send":  # a snapshot already on its way
            closed = await communicator.receive_output(timeout=20)
        code = CLOSE_UNAUTHENTICATED if revoke == "sign-out" else CLOSE_FORBIDDEN
        assert closed == {"type": "websocket.close", "code": code}
        await communicator.wait()

    async_to_sync(scenario)(world)


def test_a_failed_viewer_check_does_not_end_the_pulls(
    world: World, settings: object, monkeypatch: Any
) -> None:
    """Review: a database error in the viewer's re-check (outside the pull loop's try) ended the
    pull task without a word; the socket stayed open and "live" and never updated again."""
    from portal import consumers

    settings.PORTAL_DASHBOARD_PULL_SECONDS = 0.2
    settings.PORTAL_DASHBOARD_RECHECK_SECONDS = 0
    real, calls = consumers.dashboard_scope, []

    def flaky(user: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:  # connect, the first snapshot's check, then the first pull's check
            raise RuntimeError("the database went away")
        return real(user)

    monkeypatch.setattr(consumers, "dashboard_scope", flaky)

    first, second = _two_messages(world)
    assert first["type"] == second["type"] == "snapshot"
    assert len(calls) >= 4  # checked again after the failure


def test_pull_defaults_follow_the_channel_layer(settings: object) -> None:
    assert pull_interval_seconds() == 0.0  # channels_redis: the beat task pushes
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    try:
        assert pull_interval_seconds() == 5.0
    finally:
        channel_layers.backends.clear()


def test_refresh_frames_do_not_each_build_a_snapshot(world: World, monkeypatch: Any) -> None:
    """Review: every `{"type": "refresh"}` frame built a whole snapshot (every org's running jobs,
    queue, consumption and the fleet's history), so one signed-in org admin sending frames in a
    loop kept the web process and the database busy. A refresh within
    `PORTAL_DASHBOARD_REFRESH_SECONDS` (1 s) of the last snapshot sent gets nothing: the page has
    that one already."""
    from portal import consumers

    builds = []
    real = consumers.dashboard.build_snapshot
    monkeypatch.setattr(consumers.dashboard, "build_snapshot", lambda: builds.append(1) or real())

    async def scenario(world_async: World) -> None:
        communicator = await _communicator(world_async.bob)  # an org owner
        connected, _ = await communicator.connect()
        assert connected
        await communicator.receive_json_from(timeout=5)
        for _ in range(20):
            await communicator.send_json_to({"type": "refresh"})
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect()

    async_to_sync(scenario)(world)
    assert len(builds) == 1  # the one on connect
