"""WebSocket routes of the portal (included by config/routing.py)."""

from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from portal.consumers import DASHBOARD_WS_PATH, DashboardConsumer

# Session-authenticated sockets must reject other sites' pages (cross-site WebSocket hijacking).
websocket_urlpatterns = [
    path(DASHBOARD_WS_PATH.lstrip("/"), AllowedHostsOriginValidator(DashboardConsumer.as_asgi())),
]
