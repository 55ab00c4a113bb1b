"""Cancelling, holding and releasing jobs in the admin needs its own permission,
`scheduling.operate_job` (review: the actions needed only `view_job`, so staff who may only read
the job list could cancel anyone's jobs). Staff who operate the fleet (`view_job` and
`change_node`, as a group's or a user's own permissions) keep the actions; read-only staff lose
them. Superusers have every permission."""

from django.contrib.auth.management import create_permissions
from django.db import migrations


def forwards(apps, schema_editor):
    config = apps.get_app_config("scheduling")
    config.models_module = True
    create_permissions(config, apps=apps, verbosity=0)
    config.models_module = None
    Permission = apps.get_model("auth", "Permission")
    operate = Permission.objects.get(content_type__app_label="scheduling", codename="operate_job")
    needed = list(Permission.objects.filter(content_type__app_label="scheduling",
                                            codename__in=("view_job", "change_node")))
    if len(needed) != 2:
        return
    for model in (apps.get_model("auth", "Group"), apps.get_model("auth", "User")):
        holders = model.objects.all()
        for permission in needed:
            holders = holders.filter(**{_permissions_of(model): permission})
        for holder in holders.distinct():
            getattr(holder, _permissions_of(model)).add(operate)


def _permissions_of(model) -> str:
    return "permissions" if model._meta.model_name == "group" else "user_permissions"


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0033_quota_org_project_protect"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]
    operations = [
        migrations.AlterModelOptions(
            name="job",
            options={"permissions": [("operate_job", "Can cancel, hold and release jobs in the admin")]},
        ),
        migrations.RunPython(forwards, migrations.RunPython.noop),
    ]
