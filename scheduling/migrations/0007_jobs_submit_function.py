"""`jobs_submit`: a job submission's writes in one statement (docs/decisions/0006-…).

The API's first try at `POST /api/v1/jobs`: claim the Idempotency-Key, insert the job `queued`,
lock and check every budget level, place the hold (`ledger_place_hold`, which also appends the
`sched.job.submit` audit event), count it in the budgets and point the job at it. The caller
(`scheduling/services/submission_sql.py`) then stores the response in the idempotency record and
commits, in one more round trip, as the Python path does.

It only does what it can do without deciding anything the Python path decides differently: when
the key already exists it writes nothing and answers `exists`; when a budget level would be
crossed (hard: a refusal; soft: an alert event), or the price the caller computed is no longer
the one in effect at the transaction's clock, it raises SQLSTATE GBFBK; funds short raise
`ledger_place_hold`'s GB402. Either rolls the statement back and the caller runs the Python path,
which answers exactly as it always did. Lock order (DESIGN.md §6) is the Python path's:
idempotency record -> job -> budget periods (level org, project, member; budget id) -> hold ->
buckets by id -> audit chain head.
"""

from django.db import migrations

SUBMIT = r"""
CREATE OR REPLACE FUNCTION jobs_submit(
    p_principal text, p_idem_key text, p_fingerprint text, p_ttl_seconds integer, p_lock_wait text,
    p_job jsonb, p_hold_types jsonb, p_amount bigint,
    p_price_from timestamptz, p_price_until timestamptz,  -- NULL: no later price is scheduled
    p_offset interval, p_request_id text, p_audit jsonb,
    OUT o_status text, OUT o_record bigint, OUT o_job bigint, OUT o_now timestamptz,
    OUT o_hold bigint, OUT o_hold_created timestamptz
) LANGUAGE plpgsql AS $$
DECLARE
    v_prev_wait text := current_setting('lock_timeout');
    v_org bigint := (p_job ->> 'org_id')::bigint;
    v_project bigint := (p_job ->> 'project_id')::bigint;
    v_user bigint := (p_job ->> 'user_id')::bigint;
    v_periods bigint[];
    v_over boolean;
    v_reference text;
BEGIN
    o_now := now();
    -- 1. The idempotency record: the first lock. A concurrent duplicate waits at most p_lock_wait
    -- (55P03 then means "in flight"); an existing key writes nothing here.
    PERFORM set_config('lock_timeout', p_lock_wait, true);
    INSERT INTO accounts_idempotencyrecord (principal, key, fingerprint, state, created_at, expires_at)
    VALUES (p_principal, p_idem_key, p_fingerprint, 'in_flight', o_now,
            o_now + make_interval(secs => p_ttl_seconds))
    ON CONFLICT (principal, key) DO NOTHING
    RETURNING id INTO o_record;
    PERFORM set_config('lock_timeout', v_prev_wait, true);
    IF o_record IS NULL THEN
        o_status := 'exists';
        RETURN;
    END IF;
    IF o_now < p_price_from OR o_now >= coalesce(p_price_until, 'infinity') THEN
        RAISE EXCEPTION 'the hold was priced for another price period' USING ERRCODE = 'GBFBK';
    END IF;

    -- 2. The job, `queued`, with the caller's column values (defaults included).
    -- (`SELECT * FROM f()`, not `SELECT (f()).*`, which would call f once per column.)
    INSERT INTO scheduling_job
    SELECT * FROM jsonb_populate_record(NULL::scheduling_job, p_job || jsonb_build_object(
        'id', nextval('scheduling_job_id_seq'), 'submitted_at', o_now, 'updated_at', o_now))
    RETURNING id INTO o_job;

    -- 3. Budgets: the current period of every applicable budget, created if missing, locked in
    -- lock order; any level the hold would cross goes to the Python path.
    INSERT INTO budgets_budgetperiod (budget_id, org_id, starts_at, ends_at, held, spent)
    SELECT b.id, v_org, w.starts, w.ends, 0, 0
    FROM budgets_budget b
    CROSS JOIN LATERAL (
        SELECT CASE WHEN b.period = 'month'
                    THEN date_trunc('month', o_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                    ELSE b.window_start END AS starts,
               CASE WHEN b.period = 'month'
                    THEN (date_trunc('month', o_now AT TIME ZONE 'UTC') + interval '1 month') AT TIME ZONE 'UTC'
                    ELSE b.window_end END AS ends
    ) w
    WHERE b.org_id = v_org
      AND (b.level = 'org' OR (b.level = 'project' AND b.project_id = v_project)
           OR (b.level = 'member' AND b.project_id = v_project AND b.user_id = v_user))
      AND (b.period = 'month' OR (b.window_start <= o_now AND o_now < b.window_end))
    ORDER BY b.id
    ON CONFLICT (budget_id, starts_at) DO NOTHING;
    WITH locked AS MATERIALIZED (
        SELECT p.id, p.budget_id, p.held + p.spent + p_amount > b."limit" AS over,
               CASE b.level WHEN 'org' THEN 0 WHEN 'project' THEN 1 ELSE 2 END AS level_rank
        FROM budgets_budgetperiod p JOIN budgets_budget b ON b.id = p.budget_id
        WHERE b.org_id = v_org
          AND (b.level = 'org' OR (b.level = 'project' AND b.project_id = v_project)
               OR (b.level = 'member' AND b.project_id = v_project AND b.user_id = v_user))
          AND p.starts_at = CASE WHEN b.period = 'month'
                                 THEN date_trunc('month', o_now AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
                                 ELSE b.window_start END
          AND (b.period = 'month' OR (b.window_start <= o_now AND o_now < b.window_end))
        ORDER BY level_rank, p.budget_id, p.id
        FOR UPDATE OF p
    )
    SELECT array_agg(id ORDER BY level_rank, budget_id, id), bool_or(over) INTO v_periods, v_over
    FROM locked;
    IF v_over THEN
        RAISE EXCEPTION 'a budget level would be crossed' USING ERRCODE = 'GBFBK';
    END IF;

    -- 4. The hold (its row, the funds in spend order, the journal and the submission's audit
    -- event); GB402 when the funds are short.
    v_reference := 'job:' || o_job;
    SELECT h.o_hold, h.o_created_at INTO o_hold, o_hold_created
    FROM ledger_place_hold(
        v_org, v_project, v_user, v_reference || ':submit', v_reference, p_hold_types, p_amount,
        p_offset,
        jsonb_build_object('amount', p_amount, 'project', v_project, 'user', v_user,
                           'gpu_types', p_hold_types, 'reference', v_reference),
        p_request_id, 'user', v_user::text, 'sched.job.submit', 'job', o_job::text, 'submitted',
        p_audit || jsonb_build_object('ledger', 'ledger.hold')
    ) h;
    IF o_hold IS NULL THEN  -- the key is new with the job: a conflict here is a broken invariant
        RAISE EXCEPTION 'hold key % exists', v_reference || ':submit' USING ERRCODE = 'GB000';
    END IF;

    -- 5. Count it in the budgets, and point the job at it.
    IF v_periods IS NOT NULL THEN
        UPDATE budgets_budgetperiod SET held = held + p_amount WHERE id = ANY(v_periods);
        INSERT INTO budgets_budgetcharge (period_id, hold_id, held, spent)
        SELECT u.id, o_hold, p_amount, 0 FROM unnest(v_periods) WITH ORDINALITY AS u(id, n) ORDER BY u.n;
    END IF;
    UPDATE scheduling_job SET current_hold_id = o_hold WHERE id = o_job;
    o_status := 'ok';
END
$$;
"""

DROP = "DROP FUNCTION IF EXISTS jobs_submit(text, text, text, integer, text, jsonb, jsonb, bigint, " \
       "timestamptz, timestamptz, interval, text, jsonb)"


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(SUBMIT, None)  # no parameters: "%" is plpgsql's, not a placeholder


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP, None)


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0006_job_fillfactor"),
        ("ledger", "0007_redundant_fk_indexes"),
        ("budgets", "0002_budget_scope_unique"),
        ("accounts", "0001_initial"),
        ("audit", "0003_auditevent_hash_format"),
    ]
    operations = [migrations.RunPython(forwards, backwards)]
