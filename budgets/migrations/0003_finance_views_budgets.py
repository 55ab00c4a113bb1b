"""The "finance" group may view budgets and their periods (the read-only Budget admin)."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

VIEW = ("view_budget", "view_budgetperiod")


def forwards(apps, schema_editor):
    # Permissions are normally created after migrate; create them now so the group can get them.
    config = apps.get_app_config("budgets")
    config.models_module = True
    create_permissions(config, apps=apps, verbosity=0)
    config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name="finance")
    group.permissions.add(*Permission.objects.filter(content_type__app_label="budgets", codename__in=VIEW))


def backwards(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    for group in Group.objects.filter(name="finance"):
        group.permissions.remove(
            *Permission.objects.filter(content_type__app_label="budgets", codename__in=VIEW)
        )


class Migration(migrations.Migration):
    dependencies = [
        ("budgets", "0002_budget_scope_unique"),
        ("ledger", "0004_finance_group"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
