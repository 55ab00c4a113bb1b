"""WebSocket routes (Channels)."""

from portal.routing import websocket_urlpatterns as portal_websockets

websocket_urlpatterns: list = [*portal_websockets]
