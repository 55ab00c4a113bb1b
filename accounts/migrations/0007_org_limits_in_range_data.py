"""Existing orgs brought into the range the next migration's CHECKs allow (the API's bounds).

`max_inflight_submissions` below 1 is raised to 1 (0 refused every submission of the org with 429,
for ever) and above 10,000 lowered to 10,000; `hold_window_seconds` above 2,592,000 s (30 days) is
lowered to 30 days. The admin saved such values (its form had only the database's integer range);
the API never did. Not reversed (the old values were not meaningful policies).
"""

from django.db import migrations

MAX_HOLD_WINDOW_SECONDS = 30 * 24 * 3600  # frozen copies of accounts.models' bounds at this migration
MIN_INFLIGHT_SUBMISSIONS = 1
MAX_INFLIGHT_SUBMISSIONS = 10_000


def _clamp_org_limits(apps, schema_editor):
    organizations = apps.get_model("accounts", "Organization")
    organizations.objects.filter(max_inflight_submissions__lt=MIN_INFLIGHT_SUBMISSIONS).update(
        max_inflight_submissions=MIN_INFLIGHT_SUBMISSIONS
    )
    organizations.objects.filter(max_inflight_submissions__gt=MAX_INFLIGHT_SUBMISSIONS).update(
        max_inflight_submissions=MAX_INFLIGHT_SUBMISSIONS
    )
    organizations.objects.filter(hold_window_seconds__gt=MAX_HOLD_WINDOW_SECONDS).update(
        hold_window_seconds=MAX_HOLD_WINDOW_SECONDS
    )


class Migration(migrations.Migration):
    dependencies = [("accounts", "0006_api_key_created_by_from_audit")]

    operations = [migrations.RunPython(_clamp_org_limits, migrations.RunPython.noop)]
