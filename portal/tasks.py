"""Beat task: push a dashboard snapshot to every open dashboard socket."""

from asgiref.sync import async_to_sync
from celery import shared_task
from channels.layers import InMemoryChannelLayer, get_channel_layer

from portal.consumers import DASHBOARD_GROUP
from portal.dashboard import build_snapshot


@shared_task(acks_late=True, ignore_result=True, expires=10)
def broadcast_dashboard() -> bool:
    """Build one snapshot and group_send it; returns whether it was sent.

    Read-only and idempotent: running it twice just sends two equal snapshots. With an in-memory
    layer nobody outside this process could hear it, so it does nothing (consumers pull instead).
    """
    layer = get_channel_layer()
    if layer is None or isinstance(layer, InMemoryChannelLayer):
        return False
    async_to_sync(layer.group_send)(
        DASHBOARD_GROUP, {"type": "dashboard.snapshot", "snapshot": build_snapshot()}
    )
    return True
