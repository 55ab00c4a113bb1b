"""The "finance" group: read the journal, holds and audit trail; issue and void credits."""

from django.contrib.auth.management import create_permissions
from django.db import migrations

VIEW = {
    "ledger": ("bucket", "ledgertransaction", "posting", "hold", "holdline"),
    "audit": ("auditevent",),
}
CUSTOM = ("issue_credits", "void_credits")


def forwards(apps, schema_editor):
    # Permissions are normally created after migrate; create them now so the group can get them.
    for label in ("ledger", "audit"):
        config = apps.get_app_config(label)
        config.models_module = True
        create_permissions(config, apps=apps, verbosity=0)
        config.models_module = None
    Group = apps.get_model("auth", "Group")
    Permission = apps.get_model("auth", "Permission")
    group, _ = Group.objects.get_or_create(name="finance")
    wanted = [
        Permission.objects.get(content_type__app_label=app, codename=f"view_{model}")
        for app, models in VIEW.items()
        for model in models
    ]
    wanted += [
        Permission.objects.get(content_type__app_label="ledger", codename=code) for code in CUSTOM
    ]
    group.permissions.add(*wanted)


def backwards(apps, schema_editor):
    apps.get_model("auth", "Group").objects.filter(name="finance").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0003_journal_append_only"),
        ("audit", "0002_append_only_trigger"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
