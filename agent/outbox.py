"""Durable exit reports: kept until the server has them, persisted so a restart still delivers them.

An exit report carries the final usage and the outcome that settles the attempt's hold; losing it
would leave the server to settle on the last heartbeat and requeue by policy. The file is tiny
(one entry per undelivered attempt) and rewritten atomically on every change.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.logs import alog
from agent.runner import ExitRecord

log = logging.getLogger("agent.outbox")
FILE_VERSION = 1


@dataclass
class Entry:
    """One undelivered exit report."""

    attempt_id: int
    body: dict[str, Any]
    tries: int = 0
    # Monotonic time of the next try; not persisted (monotonic time means nothing after a restart).
    next_at: float = 0.0


class Outbox:
    """Exit reports by attempt id; the first report for an attempt wins (the server is idempotent)."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._entries: dict[int, Entry] = {}
        if path is not None:
            self._load(path)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, attempt_id: object) -> bool:
        return attempt_id in self._entries

    def ids(self) -> list[int]:
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        return [self._entries[k] for k in sorted(self._entries)]

    def add(self, record: ExitRecord) -> bool:
        if record.attempt_id in self._entries:
            return False
        self._entries[record.attempt_id] = Entry(record.attempt_id, record.body())
        self._save()
        return True

    def due(self, now: float) -> list[Entry]:
        return [e for e in sorted(self._entries.values(), key=lambda e: e.attempt_id) if e.next_at <= now]

    def postpone(self, attempt_id: int, until: float, *, count: bool = True) -> None:
        """Next try not before ``until``; ``count=False`` when waiting on something else (no backoff)."""
        entry = self._entries[attempt_id]
        entry.tries += int(count)
        entry.next_at = until
        # Persisting tries is not needed for correctness; skip the write on the hot retry path.

    def remove(self, attempt_id: int) -> None:
        if self._entries.pop(attempt_id, None) is not None:
            self._save()

    def _load(self, path: Path) -> None:
        try:
            raw = path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.error("cannot read outbox %s: %s", path, exc, extra={"attempt": "-"})
            return
        try:
            data = json.loads(raw)
            if data.get("version") != FILE_VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            for item in data["reports"]:
                attempt_id = int(item["attempt_id"])
                self._entries[attempt_id] = Entry(attempt_id, dict(item["body"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Keep the bad file for a human rather than silently discarding reports.
            aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
            os.replace(path, aside)
            log.error("outbox %s unreadable (%s); moved to %s", path, exc, aside, extra={"attempt": "-"})
            self._entries.clear()
            return
        for attempt_id in self._entries:
            alog(log, logging.INFO, attempt_id, "exit report loaded from %s", path)

    def _save(self) -> None:
        if self._path is None:
            return
        try:
            self._write(self._path)
        except OSError as exc:
            # A full or read-only disk must not stop delivery: the reports stay in memory and the
            # next change tries the file again.
            log.error("cannot persist outbox to %s: %s", self._path, exc, extra={"attempt": "-"})

    def _write(self, path: Path) -> None:
        data = {
            "version": FILE_VERSION,
            "reports": [{"attempt_id": e.attempt_id, "body": e.body} for e in self._entries.values()],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write-to-temp, fsync, rename: a crash leaves either the old file or the new one, never half.
        fd, tmp = tempfile.mkstemp(prefix=".outbox-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
