"""Index `scheduling_allocation.released_at` for the dashboard's GPUs-in-use-last-hour chart.

The chart reads the allocations live now or released within the hour. Allocations are never
deleted (they are the history), so the table grows with every attempt; the index keeps the read
to the window. On PostgreSQL it is built `CONCURRENTLY` (outside a transaction), so a deploy does
not block the scheduler's writes to the table; the embedded SQLite database builds it plainly.
"""

from django.db import migrations, models

_NAME = "alloc_released_idx"


def _create(apps, schema_editor):
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(
        f"CREATE INDEX {concurrently}IF NOT EXISTS {_NAME} ON scheduling_allocation (released_at)"
    )


def _drop(apps, schema_editor):
    concurrently = "CONCURRENTLY " if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP INDEX {concurrently}IF EXISTS {_NAME}")


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY cannot run inside a transaction

    dependencies = [("scheduling", "0007_jobs_submit_function")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddIndex(
                    model_name="allocation",
                    index=models.Index(fields=["released_at"], name=_NAME),
                )
            ],
            database_operations=[migrations.RunPython(_create, _drop)],
        )
    ]
