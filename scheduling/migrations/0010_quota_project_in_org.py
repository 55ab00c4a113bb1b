"""A project quota's project must belong to the quota's org, enforced by PostgreSQL.

`Quota.clean` refuses such a row in forms, but rows written another way (the shell, a script,
rows saved before `clean` existed) were not checked, and the scheduler keys project quotas by
project alone. A composite foreign key (project_id, org_id) -> accounts_project (id, org_id) now
refuses them everywhere; an org-wide quota (project NULL) is not checked (MATCH SIMPLE).

If rows that break it exist, the migration stops and lists them instead of deleting anything:
fix them (move the quota to the project's org, or delete it), then migrate again. The embedded
SQLite database has no such constraint (it cannot add one to an existing table).
"""

from django.db import migrations

_NAME = "quota_project_in_org"


def _add(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT q.id, q.org_id, q.project_id, p.org_id FROM scheduling_quota q "
            "JOIN accounts_project p ON p.id = q.project_id WHERE p.org_id <> q.org_id ORDER BY q.id"
        )
        wrong = cursor.fetchall()
    if wrong:
        rows = "; ".join(f"quota {q} (org {o}) names project {p} of org {po}" for q, o, p, po in wrong)
        raise RuntimeError(f"Project quotas under another org's name: {rows}. Fix them, then migrate.")
    schema_editor.execute(
        f"ALTER TABLE scheduling_quota ADD CONSTRAINT {_NAME} FOREIGN KEY (project_id, org_id) "
        "REFERENCES accounts_project (id, org_id) ON DELETE CASCADE"
    )


def _drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE scheduling_quota DROP CONSTRAINT IF EXISTS {_NAME}")


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0002_project_id_org_unique"),
        ("scheduling", "0009_job_dependencies"),
    ]

    operations = [migrations.RunPython(_add, _drop)]
