"""`ledger_place_hold` leaves out a bucket that expired while it waited for the bucket's lock.

Its eligible-bucket query (`... FOR UPDATE`) compared `expires_at` with the transaction's `now()`.
A placement that began before a bucket's expiry and waited for its lock (a capture or release
holding it; the expiry sweep skips a locked bucket) got the row after the expiry, and the new hold
drew on an expired bucket (review, session 14). Each locked bucket is now also filtered, after its
lock, with `expires_at > greatest(v_now, clock_timestamp() + p_offset)` (ADR 0012): the rows of
the materialized `locked` CTE are produced one by one as they are locked, and the filter reads
the wall clock for each after its lock. The Python path filters its locked buckets the same way
(`ledger.services.holds.lock_eligible_buckets`). Nothing else changes.
"""

import importlib

from django.db import migrations

_0005 = importlib.import_module("ledger.migrations.0005_hot_path_functions")
_0006 = importlib.import_module("ledger.migrations.0006_hot_path_late_bucket_locks")
_0009 = importlib.import_module("ledger.migrations.0009_release_decides_expiry_after_bucket_locks")

UNFILTERED = "FROM locked WINDOW w AS"
FILTERED = (
    "FROM locked WHERE expires_at IS NULL OR expires_at > greatest(v_now, clock_timestamp() + p_offset)\n"
    "        WINDOW w AS"
)


def place_sql() -> str:
    sql = _0006.PLACE
    assert sql.count(UNFILTERED) == 1
    return _0005.expand(sql.replace(UNFILTERED, FILTERED), SPEND_BUCKET=_0005.SPEND.format(id="id"))


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(place_sql(), None)  # no parameters: "%" is plpgsql's, not a placeholder


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    _0006.forwards(apps, schema_editor)  # all three functions as 0006 made them, then 0009's release
    _0009.forwards(apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("ledger", "0009_release_decides_expiry_after_bucket_locks")]
    operations = [migrations.RunPython(forwards, backwards)]
