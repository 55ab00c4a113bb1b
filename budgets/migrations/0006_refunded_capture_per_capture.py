"""Refunds are laid on the captures themselves, not on stretches of positions (review: a capture
committed after a refund but begun before an earlier one shifted the positions). The stretches
0005 recorded cannot be mapped to captures, so they are dropped: a recount then counts the
captures they covered as spent (as before 0005), and no budget period credit already given is
taken back."""

import django.db.models.deletion
from django.db import migrations, models


def drop_stretches(apps, schema_editor):
    apps.get_model("budgets", "RefundedCapture").objects.all().delete()


class Migration(migrations.Migration):

    dependencies = [("budgets", "0005_refunded_capture"), ("ledger", "0011_refunds")]

    operations = [
        migrations.RunPython(drop_stretches, migrations.RunPython.noop),
        migrations.RemoveConstraint(model_name="refundedcapture", name="refunded_capture_range"),
        migrations.RemoveField(model_name="refundedcapture", name="lo"),
        migrations.RemoveField(model_name="refundedcapture", name="hi"),
        migrations.AddField(
            model_name="refundedcapture", name="amount", field=models.BigIntegerField(default=1),
            preserve_default=False,  # the table is empty: the default fills no row
        ),
        migrations.AddField(
            model_name="refundedcapture", name="capture",
            field=models.ForeignKey(default=1, on_delete=django.db.models.deletion.PROTECT, related_name="+",
                                    to="ledger.ledgertransaction"),
            preserve_default=False,
        ),
        migrations.AddConstraint(
            model_name="refundedcapture",
            constraint=models.CheckConstraint(condition=models.Q(("amount__gt", 0)),
                                              name="refunded_capture_amount_positive"),
        ),
    ]
