"""The embedded mode's file-system broker, with messages written atomically.

kombu's filesystem transport creates a message file and then writes it, so a worker polling the
folder can take the file while it is still empty and die on the JSON (celery/kombu#1551; QA: the
worker crashed after ~24 minutes of `make run`, and honcho stopped the whole service with it).
Here a message is written under a name the reader skips (`.part`) and renamed into place, which
is atomic on one file system: a reader sees a message whole or not at all.
"""

from __future__ import annotations

import os
import uuid
from time import monotonic
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

ALIAS = "gpubankfs"


class Channel(filesystem.Channel):
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = f"{final}.part"  # not "<queue>.msg": `_get` passes it by
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel


def register() -> None:
    """Make `gpubankfs://` a broker URL kombu knows (before any connection is made)."""
    TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
