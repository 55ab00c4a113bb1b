"""Fire API requests from real threads, each on its own database connection."""

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connection
from rest_framework.test import APIClient

# Other test runs share the PostgreSQL server (max_connections=100): stay well below it.
MAX_THREADS = 24


def run_concurrently(calls: Sequence[Callable[[], Any]], threads: int = MAX_THREADS) -> list[Any]:
    """Run every call on a pool of real threads, all released at once; close their connections."""
    gate = threading.Event()

    def run(call: Callable[[], Any]) -> Any:
        gate.wait()
        try:
            return call()
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=min(threads, len(calls))) as pool:
        futures = [pool.submit(run, call) for call in calls]
        gate.set()
        return [f.result() for f in futures]


def submit_call(client: APIClient, body: dict, key: str) -> Callable[[], tuple[int, dict, bytes]]:
    """A POST /api/v1/jobs returning (status, parsed body, raw body)."""

    def call() -> tuple[int, dict, bytes]:
        response = client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY=key)
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        return response.status_code, {**response.json(), "_replayed": replayed}, response.content

    return call

    return call
