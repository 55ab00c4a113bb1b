"""Prometheus metrics of metering, and the /metrics view.

Counters live in each web process; reconciliation results are computed by a Celery worker, so
they are kept in the shared cache and read by a collector at scrape time (any process can serve).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

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


def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
