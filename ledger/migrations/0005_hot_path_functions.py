"""The hot path in SQL: place a hold, capture, release a hold -- each one call.

`ledger_place_hold`, `ledger_capture` and `ledger_release_hold` do on PostgreSQL what the Python
services do elsewhere (docs/decisions/0003-ledger-hot-path-in-sql.md): take the locks in the
ledger's order (idempotency record / hold -> buckets by id -> audit chain head, DESIGN.md §6),
decide after re-reading under them, write with conditional UPDATEs (a short row count raises
SQLSTATE GB000, "invariant broken under lock", which rolls everything back), insert the balanced
journal transaction, and append the operation's format-2 audit event (`audit_append_v2`). Rule
violations are not exceptions: the function returns a status and the Python service raises the
typed error, which rolls the transaction (or its savepoint) back as before; the one refusal that
comes after a write (insufficient credits, after the hold row is inserted) is raised as SQLSTATE
GB402 with the available amount as DETAIL, so the statement leaves nothing behind even when it
is its own transaction (autocommit).

The functions are called as server-side prepared statements (ledger/services/_sql.py), so their
plans and the plans of the statements inside them are cached per connection.
"""

from django.db import migrations

# Spend order (DESIGN.md §2): expires_at nulls last, promotional before paid, effective_at, id.
SPEND = "expires_at IS NULL, expires_at, kind <> 'promotional', effective_at, {id}"
SPEND_REVERSED = (
    "expires_at IS NULL DESC, expires_at DESC, kind <> 'promotional' DESC, effective_at DESC, {id} DESC"
)

# Fragments shared by the functions below (formatted in with str.replace, so "%" and braces in
# the PL/pgSQL stay as they are).
CHECK_BUCKETS = """GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count <> cardinality(ARRAY) THEN
        RAISE EXCEPTION 'ledger write under lock: % of % buckets', v_count, cardinality(ARRAY)
            USING ERRCODE = 'GB000';
    END IF;"""
INSERT_TXN = """INSERT INTO ledger_ledgertransaction (org_id, kind, key, hold_id, created_at, memo, amount,
                                          params, request_id)"""
# The hold's open lines, their buckets locked by id (re-reading the lines), with what each holds.
OPEN_LINES = """WITH locked AS MATERIALIZED (
        SELECT l.id, l.bucket_id, l.authorized - l.captured - l.released AS open,
               b.expires_at, b.kind, b.effective_at
        FROM ledger_holdline l JOIN ledger_bucket b ON b.id = l.bucket_id
        WHERE l.hold_id = p_hold AND l.authorized > l.captured + l.released
        ORDER BY l.bucket_id, l.id FOR UPDATE OF b
    )"""
LINES_SHORT = """IF v_open < AMOUNT THEN
        RAISE EXCEPTION 'hold %: open lines hold % of the % needed', p_hold, v_open, AMOUNT
            USING ERRCODE = 'GB000';
    END IF;"""


def expand(sql: str, **spend: str) -> str:
    """Put the shared fragments (and the spend order sort) into a function's text."""
    for name, text in {
        "CHECK_V_IDS": CHECK_BUCKETS.replace("ARRAY", "v_ids"),
        "CHECK_V_BUCKETS": CHECK_BUCKETS.replace("ARRAY", "v_buckets"),
        "INSERT_TXN": INSERT_TXN,
        "OPEN_LINES": OPEN_LINES,
        "LINES_SHORT_CAPTURE": LINES_SHORT.replace("AMOUNT", "p_amount"),
        "LINES_SHORT_RELEASE": LINES_SHORT.replace("AMOUNT", "o_amount"),
        **spend,
    }.items():
        sql = sql.replace(name, text)
    return sql

PLACE = r"""
CREATE OR REPLACE FUNCTION ledger_place_hold(
    p_org bigint, p_project bigint, p_user bigint, p_key text, p_reference text, p_gpu_types jsonb,
    p_amount bigint, p_offset interval, p_params jsonb, p_request_id text,
    p_actor_type text, p_actor_id text, p_action text, p_subject_type text, p_subject_id text,
    p_reason_code text, p_data jsonb,
    OUT o_hold bigint, OUT o_created_at timestamptz, OUT o_txn bigint, OUT o_available bigint
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz := now() + p_offset;
    v_key text := 'hold:' || p_key;
    v_ids bigint[];
    v_takes bigint[];
    v_count int;
    v_buckets jsonb;
BEGIN
    -- The hold row is the idempotency record and the first lock: a concurrent insert of the same
    -- key waits for the other transaction; a conflict returns o_hold NULL (the caller replays).
    INSERT INTO ledger_hold (org_id, project_id, user_id, key, reference, gpu_types, state,
                             authorized, captured, released, created_at)
    VALUES (p_org, p_project, p_user, p_key, p_reference, p_gpu_types, 'active', p_amount, 0, 0, v_now)
    ON CONFLICT (org_id, key) DO NOTHING
    RETURNING id INTO o_hold;
    IF o_hold IS NULL THEN
        RETURN;
    END IF;
    o_created_at := v_now;
    -- Lock the eligible buckets by id, then take in spend order (all-or-nothing).
    WITH locked AS MATERIALIZED (
        SELECT b.id, b.available, b.expires_at, b.kind, b.effective_at FROM ledger_bucket b
        WHERE b.org_id = p_org AND b.available > 0 AND b.effective_at <= v_now
            AND (b.expires_at IS NULL OR b.expires_at > v_now)
            AND (b.project_id IS NULL OR b.project_id = p_project)
            AND (b.gpu_types = '[]'::jsonb
                 OR (p_gpu_types <> '[]'::jsonb AND b.gpu_types @> p_gpu_types))
        ORDER BY b.id FOR UPDATE
    ), ordered AS (
        SELECT id, available, (sum(available) OVER w)::bigint - available AS before,
               row_number() OVER w AS n
        FROM locked WINDOW w AS (ORDER BY SPEND_BUCKET ROWS UNBOUNDED PRECEDING)
    )
    SELECT coalesce(sum(available), 0),
           coalesce(array_agg(id ORDER BY n) FILTER (WHERE before < p_amount), '{}'),
           coalesce(array_agg(least(available, p_amount - before) ORDER BY n)
                    FILTER (WHERE before < p_amount), '{}')
    INTO o_available, v_ids, v_takes
    FROM ordered;
    IF o_available < p_amount THEN  -- all-or-nothing: undo the hold row too
        RAISE EXCEPTION 'insufficient credits: needs %, % available', p_amount, o_available
            USING ERRCODE = 'GB402', DETAIL = o_available::text;
    END IF;
    UPDATE ledger_bucket b SET available = b.available - u.take, held = b.held + u.take
    FROM unnest(v_ids, v_takes) AS u(id, take)
    WHERE b.id = u.id AND b.available >= u.take;
    CHECK_V_IDS
    INSERT INTO ledger_holdline (hold_id, bucket_id, authorized, captured, released)
    SELECT o_hold, u.id, u.take, 0, 0
    FROM unnest(v_ids, v_takes) WITH ORDINALITY AS u(id, take, n) ORDER BY u.n;
    INSERT_TXN
    VALUES (p_org, 'hold', v_key, o_hold, v_now, p_reference, p_amount, p_params, p_request_id)
    RETURNING id INTO o_txn;
    INSERT INTO ledger_posting (transaction_id, org_id, account, bucket_id, amount)
    SELECT o_txn, p_org, l.account, u.id, l.sign * u.take
    FROM unnest(v_ids, v_takes) WITH ORDINALITY AS u(id, take, n)
    CROSS JOIN LATERAL (VALUES (0, 'bucket_available', -1), (1, 'bucket_held', 1)) AS l(k, account, sign)
    ORDER BY u.n, l.k;
    SELECT jsonb_object_agg(u.id::text, u.take) INTO v_buckets FROM unnest(v_ids, v_takes) AS u(id, take);
    -- p_subject_id NULL: the event is the ledger's own (subject: the hold); otherwise the
    -- caller's event (e.g. a job submission), which also names the hold.
    PERFORM audit_append_v2(
        p_org, p_actor_type, p_actor_id, p_action, p_subject_type, coalesce(p_subject_id, o_hold::text),
        p_amount, p_reason_code,
        p_data || jsonb_build_object('transaction', o_txn, 'key', v_key, 'reference', p_reference,
                                     'buckets', v_buckets)
               || CASE WHEN p_subject_id IS NULL THEN '{}'::jsonb
                       ELSE jsonb_build_object('hold', o_hold) END,
        p_request_id);
END
$$;
"""

CAPTURE = r"""
CREATE OR REPLACE FUNCTION ledger_capture(
    p_hold bigint, p_amount bigint, p_key text, p_offset interval, p_params jsonb, p_memo text,
    p_request_id text, p_actor_type text, p_actor_id text,
    OUT o_status text, OUT o_org bigint, OUT o_state text, OUT o_remaining bigint,
    OUT o_txn bigint, OUT o_created_at timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    h ledger_hold%ROWTYPE;
    v_now timestamptz;
    v_open bigint;
    v_lines bigint[];
    v_buckets bigint[];
    v_takes bigint[];
    v_count int;
BEGIN
    SELECT * INTO h FROM ledger_hold WHERE id = p_hold FOR UPDATE;
    IF NOT FOUND THEN
        o_status := 'missing';
        RETURN;
    END IF;
    v_now := now() + p_offset;
    o_org := h.org_id;
    o_state := h.state;
    o_remaining := h.authorized - h.captured - h.released;
    -- After the hold lock: sees any same-key writer that committed while we waited.
    PERFORM 1 FROM ledger_ledgertransaction t WHERE t.org_id = h.org_id AND t.key = p_key;
    IF FOUND THEN
        o_status := 'replay';
        RETURN;
    END IF;
    IF h.state <> 'active' THEN
        o_status := 'inactive';
        RETURN;
    END IF;
    IF p_amount > o_remaining THEN
        o_status := 'exceeds';
        RETURN;
    END IF;
    -- Lock the open lines' buckets by id (re-reading the lines), draw in spend order.
    OPEN_LINES, ordered AS (
        SELECT id, bucket_id, open, (sum(open) OVER w)::bigint - open AS before, row_number() OVER w AS n
        FROM locked WINDOW w AS (ORDER BY SPEND_LINE ROWS UNBOUNDED PRECEDING)
    )
    SELECT coalesce(sum(open), 0),
           coalesce(array_agg(id ORDER BY n) FILTER (WHERE before < p_amount), '{}'),
           coalesce(array_agg(bucket_id ORDER BY n) FILTER (WHERE before < p_amount), '{}'),
           coalesce(array_agg(least(open, p_amount - before) ORDER BY n)
                    FILTER (WHERE before < p_amount), '{}')
    INTO v_open, v_lines, v_buckets, v_takes
    FROM ordered;
    LINES_SHORT_CAPTURE
    UPDATE ledger_bucket b SET held = b.held - u.take, spent = b.spent + u.take
    FROM unnest(v_buckets, v_takes) AS u(id, take)
    WHERE b.id = u.id AND b.held >= u.take;
    CHECK_V_BUCKETS
    UPDATE ledger_holdline l SET captured = l.captured + u.take
    FROM unnest(v_lines, v_takes) AS u(id, take) WHERE l.id = u.id;
    UPDATE ledger_hold SET captured = captured + p_amount WHERE id = p_hold;
    INSERT_TXN
    VALUES (h.org_id, 'capture', p_key, p_hold, v_now, p_memo, p_amount, p_params, p_request_id)
    RETURNING id INTO o_txn;
    INSERT INTO ledger_posting (transaction_id, org_id, account, bucket_id, amount)
    SELECT o_txn, h.org_id, p.account, p.bucket, p.amount FROM (
        SELECT u.n, 'bucket_held' AS account, u.id AS bucket, -u.take AS amount
        FROM unnest(v_buckets, v_takes) WITH ORDINALITY AS u(id, take, n)
        UNION ALL SELECT cardinality(v_buckets) + 1, 'consumption', NULL, p_amount
    ) AS p ORDER BY p.n;
    PERFORM audit_append_v2(
        h.org_id, p_actor_type, p_actor_id, 'ledger.capture', 'ledger.hold', p_hold::text, p_amount,
        'capture', jsonb_build_object('transaction', o_txn, 'key', p_key, 'reason', p_memo),
        p_request_id);
    o_status := 'ok';
    o_created_at := v_now;
    o_remaining := o_remaining - p_amount;
END
$$;
"""

RELEASE = r"""
CREATE OR REPLACE FUNCTION ledger_release_hold(
    p_hold bigint, p_key text, p_check_replay boolean, p_offset interval, p_params jsonb,
    p_memo text, p_request_id text, p_actor_type text, p_actor_id text,
    OUT o_status text, OUT o_amount bigint, OUT o_hold ledger_hold
) LANGUAGE plpgsql AS $$
DECLARE
    v_now timestamptz;
    v_lines bigint[];
    v_buckets bigint[];
    v_takes bigint[];
    v_expired boolean[];
    v_open bigint;
    v_to_expiry bigint;
    v_txn bigint;
    v_count int;
BEGIN
    SELECT * INTO o_hold FROM ledger_hold WHERE id = p_hold FOR UPDATE;
    IF NOT FOUND THEN
        o_status := 'missing';
        RETURN;
    END IF;
    IF p_check_replay THEN
        PERFORM 1 FROM ledger_ledgertransaction t WHERE t.org_id = o_hold.org_id AND t.key = p_key;
        IF FOUND THEN
            o_status := 'replay';
            RETURN;
        END IF;
    END IF;
    IF o_hold.state <> 'active' THEN
        o_status := 'inactive';
        RETURN;
    END IF;
    v_now := now() + p_offset;
    o_amount := o_hold.authorized - o_hold.captured - o_hold.released;
    -- Give everything back to the exact buckets, latest-expiring first; a part whose bucket has
    -- expired goes to expiry (DESIGN.md §4).
    OPEN_LINES, ordered AS (
        SELECT id, bucket_id, open, expires_at IS NOT NULL AND expires_at <= v_now AS expired,
               (sum(open) OVER w)::bigint - open AS before, row_number() OVER w AS n
        FROM locked WINDOW w AS (ORDER BY SPEND_LINE_REVERSED ROWS UNBOUNDED PRECEDING)
    )
    SELECT coalesce(sum(open), 0),
           coalesce(array_agg(id ORDER BY n) FILTER (WHERE before < o_amount), '{}'),
           coalesce(array_agg(bucket_id ORDER BY n) FILTER (WHERE before < o_amount), '{}'),
           coalesce(array_agg(least(open, o_amount - before) ORDER BY n)
                    FILTER (WHERE before < o_amount), '{}'),
           coalesce(array_agg(expired ORDER BY n) FILTER (WHERE before < o_amount), '{}')
    INTO v_open, v_lines, v_buckets, v_takes, v_expired
    FROM ordered;
    LINES_SHORT_RELEASE
    UPDATE ledger_bucket b SET
        held = b.held - u.take,
        available = b.available + CASE WHEN u.expired THEN 0 ELSE u.take END,
        expired = b.expired + CASE WHEN u.expired THEN u.take ELSE 0 END
    FROM unnest(v_buckets, v_takes, v_expired) AS u(id, take, expired)
    WHERE b.id = u.id AND b.held >= u.take;
    CHECK_V_BUCKETS
    UPDATE ledger_holdline l SET released = l.released + u.take
    FROM unnest(v_lines, v_takes) AS u(id, take) WHERE l.id = u.id;
    UPDATE ledger_hold SET released = released + o_amount, state = 'settled', settled_at = v_now
    WHERE id = p_hold AND state = 'active'
    RETURNING * INTO o_hold;
    INSERT_TXN
    VALUES (o_hold.org_id, 'release', p_key, p_hold, v_now, p_memo, o_amount, p_params, p_request_id)
    RETURNING id INTO v_txn;
    SELECT coalesce(sum(u.take) FILTER (WHERE u.expired), 0) INTO v_to_expiry
    FROM unnest(v_takes, v_expired) AS u(take, expired);
    INSERT INTO ledger_posting (transaction_id, org_id, account, bucket_id, amount)
    SELECT v_txn, o_hold.org_id, p.account, p.bucket, p.amount FROM (
        SELECT u.n, 0 AS k, 'bucket_held' AS account, u.id AS bucket, -u.take AS amount
        FROM unnest(v_buckets, v_takes, v_expired) WITH ORDINALITY AS u(id, take, expired, n)
        UNION ALL
        SELECT u.n, 1, 'bucket_available', u.id, u.take
        FROM unnest(v_buckets, v_takes, v_expired) WITH ORDINALITY AS u(id, take, expired, n)
        WHERE NOT u.expired
        UNION ALL  -- one expiry leg, where the first expired part is (as the Python path merges it)
        SELECT min(u.n), 1, 'expiry', NULL, sum(u.take)::bigint
        FROM unnest(v_takes, v_expired) WITH ORDINALITY AS u(take, expired, n)
        WHERE u.expired HAVING count(*) > 0
    ) AS p ORDER BY p.n, p.k;
    PERFORM audit_append_v2(
        o_hold.org_id, p_actor_type, p_actor_id, 'ledger.release', 'ledger.hold', p_hold::text,
        o_amount, 'release',
        jsonb_build_object('transaction', v_txn, 'key', p_key, 'reason', p_memo,
                           'released', o_amount, 'to_expiry', v_to_expiry),
        p_request_id);
    o_status := 'ok';
END
$$;
"""

DROP = """
DROP FUNCTION IF EXISTS ledger_place_hold(bigint, bigint, bigint, text, text, jsonb, bigint, interval,
    jsonb, text, text, text, text, text, text, text, jsonb);
DROP FUNCTION IF EXISTS ledger_capture(bigint, bigint, text, interval, jsonb, text, text, text, text);
DROP FUNCTION IF EXISTS ledger_release_hold(bigint, text, boolean, interval, jsonb, text, text, text, text);
"""


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for sql in (
        expand(PLACE, SPEND_BUCKET=SPEND.format(id="id")),
        expand(CAPTURE, SPEND_LINE=SPEND.format(id="bucket_id")),
        expand(RELEASE, SPEND_LINE_REVERSED=SPEND_REVERSED.format(id="bucket_id")),
    ):
        schema_editor.execute(sql, None)  # no parameters: "%" is plpgsql's, not a placeholder


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, None)


class Migration(migrations.Migration):
    dependencies = [
        ("ledger", "0004_finance_group"),
        ("audit", "0003_auditevent_hash_format"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
