"""Metered usage of job attempts: the hot row that heartbeats update."""

from django.db import models
from django.db.models import F, Q


class AttemptUsage(models.Model):
    """Cumulative usage of one attempt; only ever moves forward (max of reports)."""

    attempt = models.OneToOneField(
        "scheduling.JobAttempt", primary_key=True, on_delete=models.PROTECT, related_name="usage"
    )
    org_id = models.BigIntegerField(db_index=True)
    last_seq = models.BigIntegerField(default=0)
    reported_gpu_ms = models.BigIntegerField(default=0)  # max cumulative value the agent sent
    billable_gpu_ms = models.BigIntegerField(default=0)  # capped by server-observed elapsed time
    captured_gpu_ms = models.BigIntegerField(default=0)  # usage already turned into captures
    gpu_utilization = models.FloatField(null=True, blank=True)  # telemetry, never money
    memory_used_mb = models.BigIntegerField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    # A gang on several nodes: when each node last reported its part ({"<node id>": ISO time}), so a
    # part its node no longer reports is seen while another part reports (tick.end_attempts_...).
    part_reports = models.JSONField(null=True, blank=True)
    # A gang whose first part has exited: what it had billed then and when (`end_gang_part`); the
    # parts still running after it are billed from there by the server's clock (settlement).
    gang_base_gpu_ms = models.BigIntegerField(null=True, blank=True)
    gang_base_at = models.DateTimeField(null=True, blank=True)
    # Set once, by settlement, in the same transaction; heartbeats stop moving the row after it.
    settled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(billable_gpu_ms__gte=0)
                & Q(billable_gpu_ms__lte=F("reported_gpu_ms"))
                & Q(captured_gpu_ms__lte=F("billable_gpu_ms")),
                name="usage_monotone_bounds",
            ),
        ]

    def __str__(self) -> str:
        return f"usage of attempt {self.attempt_id}"
