"""PostgreSQL rejects UPDATE and DELETE on journal rows: corrections are new reversing transactions."""

from django.db import migrations

TABLES = ("ledger_ledgertransaction", "ledger_posting")

CREATE_FUNCTION = """
CREATE OR REPLACE FUNCTION ledger_reject_change() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the ledger journal is append-only (%% on %% rejected)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END;
$$ LANGUAGE plpgsql;
"""
CREATE_TRIGGER = """
CREATE TRIGGER {table}_append_only
    BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION ledger_reject_change();
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(CREATE_FUNCTION)
    for table in TABLES:
        schema_editor.execute(CREATE_TRIGGER.format(table=table))


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for table in TABLES:
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table};")
    schema_editor.execute("DROP FUNCTION IF EXISTS ledger_reject_change();")


class Migration(migrations.Migration):
    dependencies = [("ledger", "0002_journal_amount_params_permissions")]
    operations = [migrations.RunPython(forwards, backwards)]
