"""Browser-test plumbing: an in-process ASGI server (HTTP + WebSockets) and Debian's Chromium.

pytest-django's `live_server` speaks WSGI only, so the dashboard (which needs its WebSocket) is
served by uvicorn in a thread of this process, against the same test database and settings.
Cookies ignore ports, so a session made on `live_server` also signs the user in on this server.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler
from django.core.asgi import get_asgi_application

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _application() -> ProtocolTypeRouter:
    from config.routing import websocket_urlpatterns

    return ProtocolTypeRouter(
        {
            # Static files straight from the finders, as live_server does (no collectstatic).
            "http": ASGIStaticFilesHandler(get_asgi_application()),
            "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
        }
    )


@contextmanager
def asgi_server() -> Iterator[int]:
    """Run the project's ASGI app on a free loopback port; yields the port."""
    port = _free_port()
    config = uvicorn.Config(_application(), host="127.0.0.1", port=port, log_level="warning",
                            lifespan="off", ws="websockets-sansio")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="asgi-test-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
