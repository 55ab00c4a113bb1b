"""The hot-path functions take the org's bucket rows as late as they can.

Same functions, same results as 0005 (docs/decisions/0003-ledger-hot-path-in-sql.md); only the
order of the writes inside them changes, so the hottest rows of an org -- its buckets, then its
audit chain head -- stay locked for less time (they are locked until the commit):

- `ledger_place_hold` inserts the journal transaction row before locking the eligible buckets
  (the row depends on nothing the bucket locks protect).
- `ledger_capture` and `ledger_release_hold` decide from the hold's open lines -- which only
  writers holding the hold lock change, and the hold is locked first -- and from the buckets'
  fixed attributes (`expires_at`, `kind`, `effective_at`: set at issuance, never updated), not
  from bucket balances; they write the hold lines, the hold, the journal transaction and its
  postings, and only then lock the buckets (by ascending id) and update them conditionally
  (`held >= take`, row count checked: SQLSTATE GB000 rolls everything back), then append the
  audit event (chain head last). The lock order (hold -> buckets by id -> audit head) is
  unchanged.
"""

import importlib

from django.db import migrations

_0005 = importlib.import_module("ledger.migrations.0005_hot_path_functions")

# The hold's open lines with their buckets' fixed attributes (no bucket lock: see above).
OPEN_LINES = """WITH locked AS MATERIALIZED (
        SELECT l.id, l.bucket_id, l.authorized - l.captured - l.released AS open,
               b.expires_at, b.kind, b.effective_at
        FROM ledger_holdline l JOIN ledger_bucket b ON b.id = l.bucket_id
        WHERE l.hold_id = p_hold AND l.authorized > l.captured + l.released
    )"""
DECIDE_NOTE = (
    "the hold lock protects its lines; spend order uses the buckets' fixed attributes only"
)
# Several buckets: lock them by ascending id first (one bucket: the UPDATE locks it).
LOCK_BUCKETS = """IF cardinality(v_buckets) > 1 THEN
        PERFORM 1 FROM ledger_bucket WHERE id = ANY(v_buckets) ORDER BY id FOR UPDATE;
    END IF;"""
CHECK_LINES = """GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count <> cardinality(v_lines) THEN
        RAISE EXCEPTION 'hold %: % of % lines updated', p_hold, v_count, cardinality(v_lines)
            USING ERRCODE = 'GB000';
    END IF;"""

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
    -- The journal row needs nothing the bucket locks protect: written before taking them, so the
    -- org's buckets stay locked for as little as possible.
    INSERT_TXN
    VALUES (p_org, 'hold', v_key, o_hold, v_now, p_reference, p_amount, p_params, p_request_id)
    RETURNING id INTO o_txn;
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
    -- Draw in spend order from the open lines (DECIDE_NOTE).
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
    UPDATE ledger_holdline l SET captured = l.captured + u.take
    FROM unnest(v_lines, v_takes) AS u(id, take) WHERE l.id = u.id;
    CHECK_V_LINES
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
    LOCK_BUCKETS
    UPDATE ledger_bucket b SET held = b.held - u.take, spent = b.spent + u.take
    FROM unnest(v_buckets, v_takes) AS u(id, take)
    WHERE b.id = u.id AND b.held >= u.take;
    CHECK_V_BUCKETS
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
    -- expired goes to expiry (DESIGN.md §4). Decided from the lines: DECIDE_NOTE.
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
    UPDATE ledger_holdline l SET released = l.released + u.take
    FROM unnest(v_lines, v_takes) AS u(id, take) WHERE l.id = u.id;
    CHECK_V_LINES
    UPDATE ledger_hold SET released = released + o_amount, state = 'settled', settled_at = v_now
    WHERE id = p_hold AND state = 'active'
    RETURNING * INTO o_hold;
    IF o_hold.id IS NULL THEN
        RAISE EXCEPTION 'hold %: settled under its lock', p_hold USING ERRCODE = 'GB000';
    END IF;
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
    LOCK_BUCKETS
    UPDATE ledger_bucket b SET
        held = b.held - u.take,
        available = b.available + CASE WHEN u.expired THEN 0 ELSE u.take END,
        expired = b.expired + CASE WHEN u.expired THEN u.take ELSE 0 END
    FROM unnest(v_buckets, v_takes, v_expired) AS u(id, take, expired)
    WHERE b.id = u.id AND b.held >= u.take;
    CHECK_V_BUCKETS
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


def _late(sql: str) -> str:
    for name, text in (("OPEN_LINES", OPEN_LINES), ("LOCK_BUCKETS", LOCK_BUCKETS),
                       ("CHECK_V_LINES", CHECK_LINES), ("DECIDE_NOTE", DECIDE_NOTE)):
        sql = sql.replace(name, text)
    return sql


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    spend, spend_lines = _0005.SPEND.format(id="id"), _0005.SPEND.format(id="bucket_id")
    for sql in (
        _0005.expand(PLACE, SPEND_BUCKET=spend),
        _0005.expand(_late(CAPTURE), SPEND_LINE=spend_lines),
        _0005.expand(_late(RELEASE), SPEND_LINE_REVERSED=_0005.SPEND_REVERSED.format(id="bucket_id")),
    ):
        schema_editor.execute(sql, None)  # no parameters: "%" is plpgsql's, not a placeholder


class Migration(migrations.Migration):
    dependencies = [("ledger", "0005_hot_path_functions")]
    # Backwards: 0005's versions of the same functions.
    operations = [migrations.RunPython(forwards, _0005.forwards)]
