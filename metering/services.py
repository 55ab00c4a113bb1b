"""Metering services (docs/interfaces.md): every write of the metering app, by concept.

- heartbeats: `ingest_heartbeats(*, node, items) -> IngestResult` (the hot path)
- settlement: `settle_attempt(*, attempt, outcome) -> Hold` (exactly once)
- charging: `charge_progress(*, attempt) -> ChargeResult` (captures, extensions, out-of-credit)
- reports: agent assignments, started and exit reports
- sweeps: node liveness, stranded holds, nightly reconciliation
"""

from metering.charging import ChargeResult, charge_progress
from metering.heartbeats import HeartbeatItem, IngestResult, ingest_heartbeats
from metering.reports import ExitReport, ExitResult, assignments, report_exit, report_started
from metering.settlement import settle_attempt

__all__ = [
    "ChargeResult",
    "ExitReport",
    "ExitResult",
    "HeartbeatItem",
    "IngestResult",
    "assignments",
    "charge_progress",
    "ingest_heartbeats",
    "report_exit",
    "report_started",
    "settle_attempt",
]
