"""WebSocket routes (Channels)."""

websocket_urlpatterns: list = []
