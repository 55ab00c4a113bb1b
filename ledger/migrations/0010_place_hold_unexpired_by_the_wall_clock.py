"""`ledger_place_hold` leaves out a bucket that expired while it waited for the bucket's lock.

Its eligible-bucket query (`... FOR UPDATE`) compared `expires_at` with the transaction's `now()`.
A placement that began before a bucket's expiry and waited for its lock (a capture or release
holding it; the expiry sweep skips a locked bucket) got the row after the expiry, and the new hold
drew on an expired bucket (review, session 14). Now the function locks the eligible buckets
first (by id, as before), then reads `greatest(v_now, clock_timestamp() + p_offset)` with every
lock held, and takes from the locked buckets, re-read, that are still unexpired by it (ADR 0012).
A filter on each row right after its own lock was not enough (a second review): a bucket locked
at once could expire while the placement waited for another one's lock. The Python path does the
same (`ledger.services.holds.lock_eligible_buckets`). Nothing else changes.
"""

import importlib

from django.db import migrations

_0005 = importlib.import_module("ledger.migrations.0005_hot_path_functions")
_0006 = importlib.import_module("ledger.migrations.0006_hot_path_late_bucket_locks")
_0009 = importlib.import_module("ledger.migrations.0009_release_decides_expiry_after_bucket_locks")

OLD_LOCK = """    -- Lock the eligible buckets by id, then take in spend order (all-or-nothing).
    WITH locked AS MATERIALIZED (
        SELECT b.id, b.available, b.expires_at, b.kind, b.effective_at FROM ledger_bucket b
        WHERE b.org_id = p_org AND b.available > 0 AND b.effective_at <= v_now
            AND (b.expires_at IS NULL OR b.expires_at > v_now)
            AND (b.project_id IS NULL OR b.project_id = p_project)
            AND (b.gpu_types = '[]'::jsonb
                 OR (p_gpu_types <> '[]'::jsonb AND b.gpu_types @> p_gpu_types))
        ORDER BY b.id FOR UPDATE
    ), ordered AS ("""
NEW_LOCK = """    -- Lock the eligible buckets by id; then, all locks held, read the wall clock and take from
    -- those still unexpired by it, re-read, in spend order (all-or-nothing; 0010).
    SELECT coalesce(array_agg(e.id ORDER BY e.id), '{}') INTO v_locked FROM (
        SELECT b.id FROM ledger_bucket b
        WHERE b.org_id = p_org AND b.available > 0 AND b.effective_at <= v_now
            AND (b.expires_at IS NULL OR b.expires_at > v_now)
            AND (b.project_id IS NULL OR b.project_id = p_project)
            AND (b.gpu_types = '[]'::jsonb
                 OR (p_gpu_types <> '[]'::jsonb AND b.gpu_types @> p_gpu_types))
        ORDER BY b.id FOR UPDATE
    ) AS e;
    v_wall := greatest(v_now, clock_timestamp() + p_offset);
    WITH locked AS MATERIALIZED (
        SELECT b.id, b.available, b.expires_at, b.kind, b.effective_at FROM ledger_bucket b
        WHERE b.id = ANY(v_locked) AND b.available > 0
            AND (b.expires_at IS NULL OR b.expires_at > v_wall)
    ), ordered AS ("""
OLD_DECLARE = "    v_buckets jsonb;\n"
NEW_DECLARE = "    v_buckets jsonb;\n    v_locked bigint[];\n    v_wall timestamptz;\n"


def place_sql() -> str:
    sql = _0006.PLACE
    for old, new in ((OLD_LOCK, NEW_LOCK), (OLD_DECLARE, NEW_DECLARE)):
        assert sql.count(old) == 1, old
        sql = sql.replace(old, new)
    return _0005.expand(sql, SPEND_BUCKET=_0005.SPEND.format(id="id"))


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
