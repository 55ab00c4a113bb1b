"""`jobs_submit` takes the org's budget-definition lock shared before it reads the budgets.

A budget set while a submission was in flight did not count that submission's hold (see
`budgets/scope_lock.py`). The function is 0007's with one statement added before step 3; it is
its own statement so that the budget reads after it see a budget whose setting it waited for
(READ COMMITTED: each statement of a volatile function takes a new snapshot). The key is
`budgets.scope_lock._key`'s: class "BUDG", the org id modulo 2^31.
"""

import importlib

from django.db import migrations

_0007 = importlib.import_module("scheduling.migrations.0007_jobs_submit_function")
_ANCHOR = "    -- 3. Budgets:"
_LOCK = (
    "    -- 2b. The org's budget-definition lock, shared (budgets/scope_lock.py).\n"
    "    PERFORM pg_advisory_xact_lock_shared(1112884295, (v_org % 2147483648)::int);\n\n"
)
assert _0007.SUBMIT.count(_ANCHOR) == 1
SUBMIT = _0007.SUBMIT.replace(_ANCHOR, _LOCK + _ANCHOR)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SUBMIT, None)  # no parameters: "%" is plpgsql's, not a placeholder


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(_0007.SUBMIT, None)


class Migration(migrations.Migration):
    dependencies = [("scheduling", "0019_node_maintenance_window")]
    operations = [migrations.RunPython(forwards, backwards)]
