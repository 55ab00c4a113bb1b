"""Existing hold windows brought into the range the next migration's CHECK allows (null or >= 60 s).

A window in (0, 60) seconds is raised to 60: shorter, the hold was extended by less than a job
uses between two metering charges (every 60 s), so the rest of its usage went unfunded. A window
of 0 becomes null: every reader already treated 0 as "no window" (`hold_seconds`, repricing:
the hold covers the whole max wall time; charging: extend by the default window), so nothing
changes for those orgs. Neither is reversed (the old values were not meaningful policies).
"""

from django.db import migrations


def _raise_short_windows(apps, schema_editor):
    organizations = apps.get_model("accounts", "Organization")
    organizations.objects.filter(hold_window_seconds=0).update(hold_window_seconds=None)
    organizations.objects.filter(hold_window_seconds__gt=0, hold_window_seconds__lt=60).update(
        hold_window_seconds=60
    )


class Migration(migrations.Migration):
    dependencies = [("accounts", "0002_project_id_org_unique")]

    operations = [migrations.RunPython(_raise_short_windows, migrations.RunPython.noop)]
