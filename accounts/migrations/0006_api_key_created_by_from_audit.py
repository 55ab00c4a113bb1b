"""Fill `ApiKey.created_by` for keys made before 0005 from their `accounts.api_key.create` audit
events (actor user), so a user's keys made just before the deploy still count toward the daily
limit (review: 0005 left them null, and the 24-hour count started again at zero). Keys an
unattended command made (no actor user) stay null, as new ones do."""

from django.conf import settings
from django.db import migrations


def forwards(apps, schema_editor):
    ApiKey = apps.get_model("accounts", "ApiKey")
    AuditEvent = apps.get_model("audit", "AuditEvent")
    User = apps.get_model(settings.AUTH_USER_MODEL)
    missing = {str(pk) for pk in ApiKey.objects.filter(created_by__isnull=True).values_list("pk", flat=True)}
    if not missing:
        return
    users = set(User.objects.values_list("pk", flat=True))
    events = AuditEvent.objects.filter(action="accounts.api_key.create", subject_type="api_key",
                                       actor_type="user").values_list("subject_id", "actor_id")
    for key_id, actor_id in events.iterator():
        if key_id in missing and actor_id.isdigit() and int(actor_id) in users:
            ApiKey.objects.filter(pk=int(key_id), created_by__isnull=True).update(created_by_id=int(actor_id))


class Migration(migrations.Migration):

    dependencies = [("accounts", "0005_api_key_created_by"), ("audit", "0003_auditevent_hash_format")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
