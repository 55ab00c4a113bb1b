"""`ledger_release_hold` decides what has expired with its buckets locked, by the wall clock.

0006 decided "expired or not" from the buckets' `expires_at` read before their locks and compared
with the transaction's `now()`. Both were wrong after a lock wait (a review, with real threads):

- a close (`void_credits(close=True)`) updates `expires_at`, which 0006 took to be fixed at
  issuance: a release that read it before the close committed gave the credits back to the
  `available` of the closed bucket;
- a release whose transaction began before a bucket's expiry but got the bucket's lock after the
  expiry sweep had committed gave them back too (its `now()` was before the expiry), and every
  later sweep of that bucket failed on its journal key `expire:<bucket>`.

Now the function locks the hold's buckets (by id) before that decision, reads them afresh, and
compares with `greatest(now(), clock_timestamp())`: whatever committed before the locks were
granted is in the past. The Python path does the same (`settlement._expiry_clock`). The buckets
are locked earlier than in 0006 (before the hold's lines and journal rows are written, not after):
the lock order (hold -> buckets by id -> audit head) is unchanged.
"""

import importlib

from django.db import migrations

_0005 = importlib.import_module("ledger.migrations.0005_hot_path_functions")
_0006 = importlib.import_module("ledger.migrations.0006_hot_path_late_bucket_locks")

LOCK_THEN_CLOCK = """o_amount := o_hold.authorized - o_hold.captured - o_hold.released;
    -- The buckets first, then the wall clock: an expiry or a close that committed while this
    -- release waited for them is in the past (0009).
    PERFORM 1 FROM ledger_bucket WHERE id IN (
        SELECT l.bucket_id FROM ledger_holdline l
        WHERE l.hold_id = p_hold AND l.authorized > l.captured + l.released
    ) ORDER BY id FOR UPDATE;
    v_expiry_now := greatest(v_now, clock_timestamp() + p_offset);"""


def release_sql() -> str:
    sql = _0006._late(_0006.RELEASE)
    for old, new in (
        ("    v_now timestamptz;\n", "    v_now timestamptz;\n    v_expiry_now timestamptz;\n"),
        ("o_amount := o_hold.authorized - o_hold.captured - o_hold.released;", LOCK_THEN_CLOCK),
        ("expires_at <= v_now AS expired", "expires_at <= v_expiry_now AS expired"),
    ):
        assert sql.count(old) == 1, old
        sql = sql.replace(old, new)
    return _0005.expand(sql, SPEND_LINE_REVERSED=_0005.SPEND_REVERSED.format(id="bucket_id"))


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(release_sql(), None)  # no parameters: "%" is plpgsql's, not a placeholder


class Migration(migrations.Migration):
    dependencies = [("ledger", "0008_bucket_closed_at")]
    # Backwards: 0006's versions of the functions.
    operations = [migrations.RunPython(forwards, _0006.forwards)]
