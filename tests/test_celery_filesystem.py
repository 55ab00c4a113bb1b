"""The embedded mode's broker writes each message atomically (config/celery_filesystem.py). QA:
kombu's filesystem transport let a polling worker take a message file before it was written; the
worker died on the empty JSON and honcho stopped the whole `make run` with it (celery/kombu#1551)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from kombu import Connection

from config import celery_filesystem


def _connection(folder: Path) -> Connection:
    celery_filesystem.register()
    options = {"data_folder_in": str(folder), "data_folder_out": str(folder), "store_processed": False}
    return Connection("gpubankfs://", transport_options=options)


def test_a_reader_never_sees_a_message_half_written(tmp_path: Path, monkeypatch: Any) -> None:
    """Between writing and renaming, a reader polling the folder finds no message (kombu's own
    transport gave it the empty file there)."""
    with _connection(tmp_path) as conn:
        channel = conn.default_channel
        seen: list[Any] = []
        real_replace = os.replace

        def replace_after_a_read(src: str, dst: str) -> None:
            try:
                seen.append(channel._get("celery"))  # a worker polling right now
            except Exception as error:
                seen.append(type(error).__name__)
            real_replace(src, dst)

        monkeypatch.setattr(celery_filesystem.os, "replace", replace_after_a_read)
        channel._put("celery", {"task": "t", "n": 1})
        assert seen == ["Empty"]
        assert channel._get("celery") == {"task": "t", "n": 1}


WRITERS, EACH = 4, 125


def test_many_writers_and_a_reader_lose_and_corrupt_nothing(tmp_path: Path) -> None:
    with _connection(tmp_path) as reader_conn:
        reader = reader_conn.default_channel
        got: list[int] = []
        done = threading.Event()
        start = threading.Barrier(WRITERS)
        errors: list[BaseException] = []

        def read() -> None:
            while not (done.is_set() and not any(p.name.endswith(".msg") for p in tmp_path.iterdir())):
                try:
                    got.append(reader._get("celery")["n"])
                except Exception as error:
                    if type(error).__name__ != "Empty":  # a message half written, or lost
                        errors.append(error)
                        return

        def write(first: int) -> None:  # a process of its own in the embedded mode: its own connection
            try:
                with _connection(tmp_path) as writer_conn:
                    writer = writer_conn.default_channel
                    start.wait(10)
                    for n in range(first, first + EACH):
                        writer._put("celery", {"n": n, "pad": "x" * 5000})
            except BaseException as error:  # reported below
                errors.append(error)

        thread = threading.Thread(target=read)
        thread.start()
        writers = [threading.Thread(target=write, args=(w * EACH,)) for w in range(WRITERS)]
        for w in writers:
            w.start()
        for w in writers:
            w.join(30)
        done.set()
        thread.join(30)
        assert errors == [] and not thread.is_alive()
        assert sorted(got) == list(range(WRITERS * EACH))
