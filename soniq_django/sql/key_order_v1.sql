-- soniq_django key order, version 1 (PostgreSQL): which job a key offers next.
--
-- Gives soniq_key_admit_v1 (claim_protocol_v12.sql) a new body: same name,
-- signature and callers. Loaded by migration 0033_key_admit_exact together
-- with the index soniq_key_parked_rank_idx on (queue, key, priority,
-- coalesce(run_at, created_at)), which replaces soniq_key_parked_order_idx
-- and soniq_key_parked_now_idx; never edited once released. The reverse
-- (key_order_v1.down.sql) puts version 12's body back.
-- See docs/decisions/0052-a-key-offers-its-most-urgent-due-job.md.
--
-- Version 12 chose among three rows (the key's first job by priority then
-- age, its first unscheduled job, its scheduled job due longest), so a
-- past-due job could wait behind a less urgent one whenever the key's most
-- urgent job was scheduled for later. Now a key offers exactly its most
-- urgent due job: by priority, then by how long it has been due (its run_at;
-- an unscheduled job's enqueue time). In that order a priority level's first
-- job is due when any of the level's jobs is, so the admission reads one
-- entry per level, from the most urgent, until a level has a due job: one
-- descent in the common case, never a scan of a level's backlog. With none
-- due, the job due first, offered at its time (soniq_key_parked_due_idx).

-- soniq_key_admit_v1: offer the key's next job, if it has room --
-- The caller holds the key's soniq_key_slots row lock. With no head and
-- running under the concurrency, the key's next job becomes the head: its
-- row is deleted from soniq_key_parked and its due time put back (for a
-- rate, no earlier than the N-th latest start plus the period). The next job
-- is the key's most urgent due job (above); with none due, the earliest due.
-- A NOTIFY wakes the workers of the queue when it is due now.
CREATE OR REPLACE FUNCTION {schema}.soniq_key_admit_v1(p_queue text, p_key text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_slot record;
    v_limit record;
    p record;
    v_at timestamptz;
    v_now timestamptz;
    v_nth timestamptz;
    v_gate text;
BEGIN
    SELECT k.running, k.head INTO v_slot
      FROM {schema}.soniq_key_slots AS k WHERE k.queue = p_queue AND k.key = p_key;
    IF NOT FOUND OR v_slot.head IS NOT NULL THEN
        RETURN;
    END IF;
    v_limit := {schema}.soniq_key_limit_v1(p_queue, p_key);
    IF v_limit.concurrency IS NOT NULL AND v_slot.running >= v_limit.concurrency THEN
        RETURN;
    END IF;
    v_gate := pg_catalog.current_setting('soniq.fenced_write', true);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    LOOP
        v_now := pg_catalog.clock_timestamp();
        -- The first job of each priority level in due order tells whether the level
        -- has a due job; the first level that has one gives the head.
        SELECT q.job_id, q.run_at, q.priority INTO p
          FROM {schema}.soniq_key_parked AS q
         WHERE q.queue = p_queue AND q.key = p_key
         ORDER BY q.priority, coalesce(q.run_at, q.created_at) LIMIT 1;
        WHILE FOUND AND p.run_at > v_now LOOP
            SELECT q.job_id, q.run_at, q.priority INTO p
              FROM {schema}.soniq_key_parked AS q
             WHERE q.queue = p_queue AND q.key = p_key AND q.priority > p.priority
             ORDER BY q.priority, coalesce(q.run_at, q.created_at) LIMIT 1;
        END LOOP;
        IF NOT FOUND THEN
            -- Nothing due: the job due first, offered at its time.
            SELECT q.job_id, q.run_at INTO p
              FROM {schema}.soniq_key_parked AS q
             WHERE q.queue = p_queue AND q.key = p_key AND q.run_at IS NOT NULL
             ORDER BY q.run_at LIMIT 1;
        END IF;
        EXIT WHEN NOT FOUND;
        DELETE FROM {schema}.soniq_key_parked AS q WHERE q.job_id = p.job_id;
        v_at := p.run_at;
        IF v_limit.rate_limit IS NOT NULL THEN
            v_now := pg_catalog.clock_timestamp();
            DELETE FROM {schema}.soniq_key_starts AS t
             WHERE t.queue = p_queue AND t.key = p_key
               AND t.started_at <= v_now - pg_catalog.make_interval(secs => v_limit.rate_period);
            SELECT t.started_at INTO v_nth
              FROM {schema}.soniq_key_starts AS t
             WHERE t.queue = p_queue AND t.key = p_key
             ORDER BY t.started_at DESC
             OFFSET v_limit.rate_limit - 1 LIMIT 1;
            IF FOUND THEN
                v_at := GREATEST(coalesce(v_at, '-infinity'::timestamptz),
                                 v_nth + pg_catalog.make_interval(secs => v_limit.rate_period));
            END IF;
        END IF;
        -- By primary key only: the rest of the predicate is one IS TRUE, so the planner
        -- cannot take soniq_jobs_claim_due_idx (scheduled_at = 9999-01-01 is every parked
        -- job) and read them all -- as it would on statistics taken before they came
        -- (claim protocol v11 does the same for its completion).
        UPDATE {schema}.soniq_jobs AS j SET scheduled_at = v_at
         WHERE j.id = p.job_id
           AND (j.status = 'queued'
                AND j.scheduled_at = '9999-01-01 00:00:00+00'::timestamptz) IS TRUE;
        IF FOUND THEN
            UPDATE {schema}.soniq_key_slots AS k SET head = p.job_id, head_run_at = p.run_at
             WHERE k.queue = p_queue AND k.key = p_key;
            IF v_at IS NULL OR v_at <= pg_catalog.clock_timestamp() THEN
                PERFORM pg_catalog.pg_notify('soniq_new_job', p_queue);
            END IF;
            EXIT;
        END IF;
        -- A parked row whose job is no longer parked (changed by hand): dropped, next.
    END LOOP;
    PERFORM pg_catalog.set_config('soniq.fenced_write', coalesce(v_gate, 'off'), true);
END
$fn$;
