"""Default priority classes, configured as data (production is never preemptible)."""

from django.db import migrations

DEFAULTS = [
    # name, rank, preemptible, can_preempt
    ("production", 500, False, True),
    ("premium", 400, True, True),
    ("standard", 300, True, True),
    ("batch", 200, True, False),
    ("interactive", 100, True, False),
]


def create(apps, schema_editor):
    PriorityClass = apps.get_model("scheduling", "PriorityClass")
    for name, rank, preemptible, can_preempt in DEFAULTS:
        PriorityClass.objects.update_or_create(
            name=name, defaults={"rank": rank, "preemptible": preemptible, "can_preempt": can_preempt}
        )


def remove(apps, schema_editor):
    apps.get_model("scheduling", "PriorityClass").objects.filter(
        name__in=[d[0] for d in DEFAULTS]
    ).delete()


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0001_initial")]
    operations = [migrations.RunPython(create, remove)]
