"""Leave 20 % of each `scheduling_job` page free, so a job's wait-reason update is a HOT update.

Every scheduling pass rewrites the wait reason of the pending jobs whose reason changed (10,000 on
the first pass of the scale bench, ~1,700 in a steady one). No index covers `wait_reason` or
`wait_detail`, so PostgreSQL can keep the new row version on the same page and skip all eight
index insertions (heap-only tuple) — but only if the page has room, which a table packed to the
default fillfactor of 100 never has. State changes (indexed) still update the indexes.

PostgreSQL only; existing pages keep their packing until they are rewritten. The embedded SQLite
database has no such setting.
"""

from django.db import migrations


def _alter(fillfactor: int):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute(f"ALTER TABLE scheduling_job SET (fillfactor = {fillfactor})")

    return run


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0005_job_fewer_indexes")]

    operations = [migrations.RunPython(_alter(80), _alter(100))]
