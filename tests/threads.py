"""Work on a thread of its own, with its own database connection, for the real-thread race tests."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Worker:
    """Runs `work()` on a thread: its result or error kept, `done` set when it ends, its database
    connection closed (each thread has its own)."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.result: Any = None
        self.errors: list[BaseException] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        from django.db import connection

        try:
            self.result = self.work()
        except BaseException as error:  # the test reports it
            self.errors.append(error)
        finally:
            self.done.set()
            connection.close()

    def start(self) -> Worker:
        self.thread.start()
        return self

    def join(self, timeout: float = 30) -> Worker:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the worker did not finish"
        return self
