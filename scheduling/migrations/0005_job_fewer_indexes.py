"""Two fewer index entries per job write (every INSERT and every state change).

- `org_id` had a single-column index that is the prefix of `job_org_state_idx` (org, state).
- `state` had, besides its btree, a `varchar_pattern_ops` index for `LIKE 'x%'`, which nothing
  runs (the admin filters and the scheduler compare with `=`); it is now `job_state_idx` alone.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0001_initial'),
        ('ledger', '0007_redundant_fk_indexes'),
        ('scheduling', '0004_verbose_names'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name='job',
            name='org',
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='accounts.organization'),
        ),
        migrations.AlterField(
            model_name='job',
            name='state',
            field=models.CharField(choices=[('queued', 'Queued'), ('scheduled', 'Scheduled'), ('running', 'Running'), ('completed', 'Completed'), ('failed', 'Failed'), ('cancelled', 'Cancelled'), ('timed_out', 'Timed Out'), ('preempted', 'Preempted')], default='queued', max_length=16),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['state'], name='job_state_idx'),
        ),
    ]
