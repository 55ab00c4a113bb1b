"""Make the heartbeat row cheap to rewrite: room on each page for HOT updates, eager autovacuum.

Heartbeats rewrite the same small set of rows all day and never change an indexed column, so with
free space on the page PostgreSQL updates them in place (HOT) without touching the indexes.
PostgreSQL only; the embedded SQLite demo has no such knobs.
"""

from django.db import migrations

SET = (
    "ALTER TABLE metering_attemptusage SET (fillfactor = 50, "
    "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 0)"
)
RESET = (
    "ALTER TABLE metering_attemptusage RESET (fillfactor, "
    "autovacuum_vacuum_scale_factor, autovacuum_vacuum_cost_delay)"
)


def _run(sql):
    def apply(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(sql)

    return apply


class Migration(migrations.Migration):

    dependencies = [
        ("metering", "0002_usage_settled_at"),
    ]

    operations = [migrations.RunPython(_run(SET), _run(RESET))]
