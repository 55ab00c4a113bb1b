"""The "finance" group may credit (refund) jobs and read the refunds (docs/ledger.md, "Refunds")."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

CODES = ("refund_job", "view_jobrefund")


def forwards(apps, schema_editor):
    config = apps.get_app_config("scheduling")
    config.models_module = True
    create_permissions(config, apps=apps, verbosity=0)
    config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name="finance")
    group.permissions.add(*Permission.objects.filter(content_type__app_label="scheduling", codename__in=CODES))


def backwards(apps, schema_editor):
    Permission = apps.get_model("auth", "Permission")
    group = apps.get_model("auth", "Group").objects.filter(name="finance").first()
    if group is not None:
        group.permissions.remove(*Permission.objects.filter(content_type__app_label="scheduling",
                                                            codename__in=CODES))


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0029_refunds"),
        ("ledger", "0004_finance_group"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
