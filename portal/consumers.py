"""The live dashboard's WebSocket: session-authenticated, scoped per viewer, push + pull.

Push: the `portal.tasks.broadcast_dashboard` beat task builds one snapshot every few seconds and
`group_send`s it to DASHBOARD_GROUP (works across processes with channels_redis).
Pull: on connect, and every `pull_interval_seconds()` without a push, the consumer builds the
snapshot itself. With the in-memory channel layer (the embedded mode) the beat process cannot
reach this process, so pulling is what keeps the page live there.
"""

import asyncio
import contextlib
import logging
import time
from importlib import import_module
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.utils.crypto import constant_time_compare

from portal import dashboard
from portal.access import DashboardScope, dashboard_scope

log = logging.getLogger(__name__)

DASHBOARD_GROUP = "portal.dashboard"
DASHBOARD_WS_PATH = "/ws/dashboard/"
# WebSocket close codes in the application range: not signed in / not allowed.
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


def pull_interval_seconds() -> float:
    """Seconds between pulls when no push arrived; 0 = pull on connect only.

    Setting PORTAL_DASHBOARD_PULL_SECONDS wins; otherwise pull every 5 s on an in-memory channel
    layer (no cross-process push) and rely on push (every few seconds) with a shared layer.
    """
    configured = getattr(settings, "PORTAL_DASHBOARD_PULL_SECONDS", None)
    if configured is not None:
        return float(configured)
    return 5.0 if isinstance(get_channel_layer(), InMemoryChannelLayer) else 0.0


@database_sync_to_async
def _scope_of(user: Any) -> DashboardScope | None:
    return dashboard_scope(user)


@database_sync_to_async
def _build_snapshot() -> dashboard.Snapshot:
    return dashboard.build_snapshot()


def refresh_seconds() -> float:
    """A `refresh` within this many seconds of the last snapshot sent is ignored
    (PORTAL_DASHBOARD_REFRESH_SECONDS, 1 s): the page has that one already, and a client sending
    refreshes in a loop made the server build a whole snapshot for each (review)."""
    return float(getattr(settings, "PORTAL_DASHBOARD_REFRESH_SECONDS", 1.0))


def recheck_seconds() -> float:
    """How often an open socket re-checks its viewer (PORTAL_DASHBOARD_RECHECK_SECONDS, 5 s)."""
    return float(getattr(settings, "PORTAL_DASHBOARD_RECHECK_SECONDS", 5.0))


@database_sync_to_async
def _current_scope(session_key: str | None, user_pk: Any) -> DashboardScope | int:
    """The viewer's dashboard scope now, or the close code when the session is gone (signed out,
    expired), belongs to someone else, or was cut by a password change (4401), or the user may no
    longer see the dashboard (4403). QA: a socket kept streaming an org's figures after its
    viewer signed out or lost the role."""
    data = import_module(settings.SESSION_ENGINE).SessionStore(session_key).load() if session_key else {}
    user = get_user_model().objects.filter(pk=user_pk).first()
    if (
        user is None or str(data.get(SESSION_KEY, "")) != str(user_pk)
        or not constant_time_compare(str(data.get(HASH_SESSION_KEY, "")), user.get_session_auth_hash())
    ):
        return CLOSE_UNAUTHENTICATED
    return dashboard_scope(user) or CLOSE_FORBIDDEN


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """Sends `{"type": "snapshot", "snapshot": {...}}` messages, cut down to the viewer's orgs."""

    scope_filter: DashboardScope | None = None
    _pull_task: asyncio.Task | None = None
    _last_sent = 0.0
    _checked_at = 0.0
    _joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            return await self._refuse(CLOSE_UNAUTHENTICATED)
        self.scope_filter = await _scope_of(user)
        if self.scope_filter is None:
            return await self._refuse(CLOSE_FORBIDDEN)
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        self._joined, self._checked_at = True, time.monotonic()
        await self.accept()
        await self._send_snapshot(await _build_snapshot())
        interval = pull_interval_seconds()
        if interval > 0:
            self._pull_task = asyncio.create_task(self._pull_loop(interval))

    async def _refuse(self, code: int) -> None:
        """Accept, then close with `code`: a close before the handshake is answered with HTTP 403
        and the browser sees only 1006, so the page could not tell "sign in again" from a dropped
        connection and reconnected for ever (QA)."""
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        if self._pull_task is not None:
            self._pull_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # the group is left anyway
                await self._pull_task
        if self._joined:
            await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """Frames that are not JSON text are ignored (QA: a binary or malformed frame raised out of
        the consumer, dropped the socket without a close and left its pull task running)."""
        if text_data is None:
            return
        try:
            content = await self.decode_json(text_data)
        except (ValueError, RecursionError):  # nested past the parser's depth too (review)
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        # The page may ask for a fresh snapshot (e.g. after the tab was hidden); nothing else. A
        # refused socket is closing: a frame that arrived meanwhile gets nothing (review).
        if self.scope_filter is None:
            return
        if isinstance(content, dict) and content.get("type") == "refresh":
            if time.monotonic() - self._last_sent < refresh_seconds():
                return  # just sent: the page has it (and a flood of frames builds nothing)
            self._last_sent = time.monotonic()  # frames arriving while this one builds wait their turn
            await self._send_snapshot(await _build_snapshot())

    async def dashboard_snapshot(self, event: dict[str, Any]) -> None:
        """Handler of the beat task's group message (type "dashboard.snapshot")."""
        await self._send_snapshot(event["snapshot"])

    async def _pull_loop(self, interval: float) -> None:
        """A failed build (a database error, a restart) is logged and the next interval tries
        again: the exception had ended the task without a word, and the page stopped updating
        until it reconnected."""
        while self.scope_filter is not None:
            await asyncio.sleep(interval)
            if time.monotonic() - self._last_sent < interval:
                continue
            try:
                await self._send_snapshot(await _build_snapshot())
            except Exception:
                log.exception("dashboard pull failed; the next one is in %s s", interval)

    async def _send_snapshot(self, snapshot: dashboard.Snapshot) -> None:
        if not await self._still_allowed():
            return
        assert self.scope_filter is not None
        self._last_sent = time.monotonic()
        await self.send_json(
            {"type": "snapshot", "snapshot": dashboard.for_scope(snapshot, self.scope_filter)}
        )

    async def _still_allowed(self) -> bool:
        """Re-check the viewer every `recheck_seconds()` before sending: a session signed out or a
        role taken away closes the socket (4401/4403) instead of streaming on; a changed role
        changes what is sent."""
        if self.scope_filter is None:
            return False
        if time.monotonic() - self._checked_at < recheck_seconds():
            return True
        session = self.scope.get("session")
        try:
            current = await _current_scope(getattr(session, "session_key", None), self.scope["user"].pk)
        except Exception:  # a database error: send nothing now, check again before the next send
            log.exception("dashboard viewer check failed; nothing sent until one succeeds")
            return False
        self._checked_at = time.monotonic()
        if isinstance(current, int):
            self.scope_filter = None
            await self.close(code=current)
            return False
        self.scope_filter = current
        return True
