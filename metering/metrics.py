"""Prometheus metrics of metering, and the /metrics view (HTTP and business metrics: config/metrics.py).

Counters live in each web process; reconciliation results are computed by a Celery worker, so
they are kept in the shared cache and read by a collector at scrape time (any process can serve).
"""

from __future__ import annotations

import contextlib
import hmac
import os
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from config import metrics as _http_and_business  # noqa: F401 (registered before the first scrape)

RECONCILIATION_CACHE_KEY = "metering:reconciliation:last"

HEARTBEAT_ITEMS = Counter("gpubank_heartbeat_items", "Job heartbeats received, by result.", ["result"])
EXIT_REPORTS = Counter("gpubank_exit_reports", "Agent exit reports, by result.", ["result"])
SWEEP_ACTIONS = Counter("gpubank_sweep_actions", "Metering sweep actions, by kind.", ["kind"])


class ReconciliationCollector(Collector):
    """Exposes the last nightly reconciliation's discrepancy counts (0 = books agree)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        last: dict[str, Any] = cache.get(RECONCILIATION_CACHE_KEY) or {}
        family = GaugeMetricFamily(
            "gpubank_reconciliation_discrepancies",
            "Discrepancies found by the last reconciliation, by check.",
            labels=["check"],
        )
        for check, count in sorted((last.get("counts") or {}).items()):
            family.add_metric([check], float(count))
        yield family
        ran = GaugeMetricFamily(
            "gpubank_reconciliation_last_run_timestamp", "Unix time of the last reconciliation."
        )
        ran.add_metric([], float(last.get("at", 0)))
        yield ran


_collector = ReconciliationCollector()
with contextlib.suppress(ValueError):  # already registered (module re-imported in a test run)
    REGISTRY.register(_collector)


def _registry() -> CollectorRegistry:
    # Multiprocess mode (gunicorn workers, Celery prefork): every process writes its values to
    # files in PROMETHEUS_MULTIPROC_DIR and a scrape of any one process aggregates them all.
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(_collector)
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The scrape; with `METRICS_TOKEN` set, only for `Authorization: Bearer <token>` (401 otherwise):
    the figures are aggregates, but queue depths, capacity and money flows are not for everyone."""
    token = settings.METRICS_TOKEN
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            response = HttpResponse("metrics need the scrape token\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)
