"""Give the periods counted before 0005 the per-hold spending charges a recount now writes.

Until 0005 a recount (a budget set mid-period, redefined, or a window opening) wrote `spent` as one
sum, with charges for the active holds' `held` only; a refund credits periods through their
charges (`budgets.refunds`), so such a period got nothing back (review). Here the part of each
period's `spent` that no charge accounts for is spread over the holds of its scope that captured
in the period, newest hold first, each up to what it captured there less what its charge already
counts: the charges then add up to the period's `spent`, as the recount makes them now."""

from django.db import migrations, transaction
from django.db.models import Sum


def _fill(apps, period_id):
    """One period, locked (every writer of its charges holds it), in its own transaction."""
    BudgetPeriod = apps.get_model("budgets", "BudgetPeriod")
    BudgetCharge = apps.get_model("budgets", "BudgetCharge")
    LedgerTransaction = apps.get_model("ledger", "LedgerTransaction")
    period = BudgetPeriod.objects.select_for_update(of=("self",)).select_related("budget").get(pk=period_id)
    counted = dict(BudgetCharge.objects.filter(period=period).values_list("hold_id", "spent"))
    unaccounted = period.spent - sum(counted.values())
    if unaccounted <= 0:
        return
    budget = period.budget
    scope = {"hold__org_id": budget.org_id}
    if budget.project_id is not None:
        scope["hold__project_id"] = budget.project_id
    if budget.user_id is not None:
        scope["hold__user_id"] = budget.user_id
    captured = (LedgerTransaction.objects.filter(kind="capture", created_at__gte=period.starts_at,
                                                 created_at__lt=period.ends_at, **scope)
                .values("hold_id").annotate(total=Sum("amount")).order_by("-hold_id"))
    charges = []
    for row in captured:
        add = min(unaccounted, row["total"] - counted.get(row["hold_id"], 0))
        if add > 0:
            charges.append(BudgetCharge(period_id=period.pk, hold_id=row["hold_id"],
                                        spent=counted.get(row["hold_id"], 0) + add))
            unaccounted -= add
        if unaccounted == 0:
            break
    BudgetCharge.objects.bulk_create(charges, update_conflicts=True, unique_fields=["period", "hold"],
                                     update_fields=["spent"])


def forwards(apps, schema_editor):
    BudgetPeriod = apps.get_model("budgets", "BudgetPeriod")
    for period_id in BudgetPeriod.objects.order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():  # one period at a time: captures elsewhere go on meanwhile
            _fill(apps, period_id)


class Migration(migrations.Migration):

    atomic = False  # each period in its own transaction (`forwards`)

    dependencies = [("budgets", "0006_refunded_capture_per_capture")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
