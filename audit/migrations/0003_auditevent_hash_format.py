"""Audit events record how their hash was computed, and PostgreSQL can append a format-2 event.

`audit_append_v2(...)` locks the chain head (creating it if needed), computes the format-2 hash
(audit/chain.py `event_digest_v2`) with `sha256()`, inserts the event and moves the head: what
`audit.services.record` does in Python, for SQL functions that write a change and its event in
one call (the ledger's hot path, ledger/migrations/0005_hot_path_functions.py).
"""

from django.db import migrations, models

CREATE = r"""
CREATE OR REPLACE FUNCTION audit_append_v2(
    p_org bigint, p_actor_type text, p_actor_id text, p_action text, p_subject_type text,
    p_subject_id text, p_amount bigint, p_reason_code text, p_data jsonb, p_request_id text
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_chain text := CASE WHEN p_org IS NULL THEN 'system' ELSE 'org:' || p_org END;
    v_now timestamptz := now();
    v_seq bigint;
    v_prev text;
    v_hash text;
    v_id bigint;
BEGIN
    -- The operation's last lock (DESIGN.md §6): the chain head.
    SELECT h.seq, h.hash INTO v_seq, v_prev FROM audit_auditchainhead h WHERE h.chain = v_chain FOR UPDATE;
    IF NOT FOUND THEN  -- first event of this chain
        INSERT INTO audit_auditchainhead (chain, seq, hash) VALUES (v_chain, 0, repeat('0', 64))
            ON CONFLICT DO NOTHING;
        SELECT h.seq, h.hash INTO v_seq, v_prev FROM audit_auditchainhead h WHERE h.chain = v_chain FOR UPDATE;
    END IF;
    v_seq := v_seq + 1;
    v_hash := encode(sha256(convert_to(jsonb_build_object(
        'v', 2, 'prev', v_prev, 'chain', v_chain, 'seq', v_seq,
        'created_at', (extract(epoch FROM v_now) * 1000000)::bigint,
        'org_id', p_org, 'actor_type', p_actor_type, 'actor_id', p_actor_id, 'action', p_action,
        'subject_type', p_subject_type, 'subject_id', p_subject_id, 'amount', p_amount,
        'reason_code', p_reason_code, 'data', p_data, 'request_id', p_request_id
    )::text, 'UTF8')), 'hex');
    INSERT INTO audit_auditevent (created_at, org_id, actor_type, actor_id, action, subject_type,
        subject_id, amount, reason_code, data, request_id, chain, seq, prev_hash, hash, hash_format)
    VALUES (v_now, p_org, p_actor_type, p_actor_id, p_action, p_subject_type, p_subject_id,
        p_amount, p_reason_code, p_data, p_request_id, v_chain, v_seq, v_prev, v_hash, 2)
    RETURNING id INTO v_id;
    UPDATE audit_auditchainhead SET seq = v_seq, hash = v_hash WHERE chain = v_chain;
    RETURN v_id;
END
$$;
"""
DROP = (
    "DROP FUNCTION IF EXISTS audit_append_v2(bigint, text, text, text, text, text, bigint, text, "
    "jsonb, text);"
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):
    dependencies = [("audit", "0002_append_only_trigger")]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="hash_format",
            field=models.PositiveSmallIntegerField(db_default=1, default=1),
        ),
        migrations.RunPython(forwards, backwards),
    ]
