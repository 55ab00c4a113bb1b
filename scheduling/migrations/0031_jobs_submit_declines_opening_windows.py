"""`jobs_submit` declines (to the Python path) when a window budget that applies has begun but is
not counted yet (`budgets.Budget.window_opened` False: its holds placed before the start are not
in its period). The Python path then refuses a hard one with `budget-window-opening` (retryable)
and counts a soft one as usual (`budgets.services.check_periods`). The function is 0020's with
the `over` test widened.
"""

import importlib

from django.db import migrations

_0020 = importlib.import_module("scheduling.migrations.0020_jobs_submit_budget_scope_lock")
_OVER = 'SELECT p.id, p.budget_id, p.held + p.spent + p_amount > b."limit" AS over,'
_OPENING = ('SELECT p.id, p.budget_id, (p.held + p.spent + p_amount > b."limit" OR NOT b.window_opened) '
            "AS over,")
assert _0020.SUBMIT.count(_OVER) == 1
SUBMIT = _0020.SUBMIT.replace(_OVER, _OPENING)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SUBMIT, None)  # no parameters: "%" is plpgsql's, not a placeholder


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_0020.SUBMIT, None)


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0030_finance_may_refund_jobs"), ("budgets", "0004_budget_window_opened")]
    operations = [migrations.RunPython(forwards, backwards)]
