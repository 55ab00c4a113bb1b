"""An operator's hold is a hold: `held_by_operator` implies `held` (review: only a comment said so).

On PostgreSQL the CHECK is added NOT VALID (no scan under the ACCESS EXCLUSIVE lock) and then
validated, which scans under a lock that lets the scheduler and submissions go on."""

from django.db import migrations, models

NAME = "job_operator_hold_is_a_hold"
CONDITION = models.Q(held=True) | models.Q(held_by_operator=False)


def add(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        model = apps.get_model("scheduling", "Job")
        schema_editor.add_constraint(model, models.CheckConstraint(condition=CONDITION, name=NAME))
        return
    table = apps.get_model("scheduling", "Job")._meta.db_table
    check = "CHECK (held OR NOT held_by_operator)"
    schema_editor.execute(f"ALTER TABLE {table} ADD CONSTRAINT {NAME} {check} NOT VALID")
    schema_editor.execute(f"ALTER TABLE {table} VALIDATE CONSTRAINT {NAME}")


def drop(apps, schema_editor):
    model = apps.get_model("scheduling", "Job")
    schema_editor.remove_constraint(model, models.CheckConstraint(condition=CONDITION, name=NAME))


class Migration(migrations.Migration):
    atomic = False  # VALIDATE in its own transaction, after the NOT VALID add committed

    dependencies = [
        ("scheduling", "0015_job_held_by_operator"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(add, drop)],
            state_operations=[migrations.AddConstraint(
                model_name="job", constraint=models.CheckConstraint(condition=CONDITION, name=NAME),
            )],
        ),
    ]
