-- soniq_django claim protocol, version 13 (PostgreSQL only): waits on key
-- rows in one order, and a claim never waits for one.
--
-- Versions 1 to 12 stay as they are; this file adds soniq_key_lock_v1 and
-- soniq_queue_budget_v3, and gives soniq_claim_many, soniq_complete_many,
-- soniq_hold_slot and soniq_key_sweep new bodies (same names, signatures,
-- answers, errors and grants; soniq_claim_many keeps version 11's
-- enable_sort = off and jit = off). Loaded by migration 0031_key_lock_order;
-- never edited once released. The reverse (claim_protocol_v13.down.sql, the
-- released bodies read back from versions 8, 10, 11 and 12, then
-- claim_protocol_v13.settings.down.sql) restores version 12. See
-- docs/decisions/0049-key-rows-locked-in-one-order.md.
--
-- Why. The triggers of version 12 keep each key's slots under its row in
-- soniq_key_slots, locked by the write that moves a keyed job. A worker above
-- concurrency 1 completes and claims jobs of several keys in one transaction
-- (a round: soniq_complete_many, then soniq_claim_many), and each row's
-- trigger locked its key's row in the order the rows were written: two
-- rounds could each hold a key the other then waited for, until PostgreSQL
-- ended one after deadlock_timeout (SQLSTATE 40P01; 6 to 12 refused rounds
-- in a run of tests/keys/test_key_batches.py). A claim also waited for the
-- key's row behind a producer's open transaction that had enqueued a job of
-- the key, up to its lock_timeout.
--
-- The rule (tests/keys/test_key_deadlocks.py):
--
--   1. A claim never waits for a key's row. soniq_claim_many takes the row of
--      each keyed candidate's key with SKIP LOCKED (a row its own transaction
--      holds is taken) and leaves a candidate whose key is held elsewhere, as
--      it leaves a locked job; soniq_queue_budget_v3 deletes a lapsed hold
--      that keeps a key's slot only when its key's row is free. (The reaper
--      in the claim waits at most its 5 ms lock_timeout, then leaves the row.)
--   2. A write that ends the runs of several keys locks their rows first, in
--      (queue, key) order under the "C" collation (soniq_key_lock_v1), before
--      any trigger runs: soniq_complete_many's batch, soniq_hold_slot (the
--      job's own key and those of the lapsed holds it deletes; soniq_fail
--      follows in its transaction), soniq_key_sweep. soniq_key_refresh already
--      goes through the keys in that order.
--
-- A transaction then waits for key rows in ascending order only, and a claim,
-- the last statement of a round, waits for none: no cycle of waits on key
-- rows can form between Soniq's own writes, whichever worker makes them. The
-- limit stays exact (the counting is version 12's, under the same locks) and
-- every slot is given back once: nothing in the triggers changed.

-- soniq_key_lock_v1: lock keys' rows in key order --
-- The rows of soniq_key_slots of the (queue, key) pairs given (a NULL key is
-- skipped, a pair named twice locked once), FOR UPDATE, in (queue, key)
-- order under the "C" collation, each wait bounded by the caller's
-- lock_timeout. A missing row is not made here: the trigger makes it.
CREATE FUNCTION {schema}.soniq_key_lock_v1(p_queues text[], p_keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM 1
       FROM {schema}.soniq_key_slots AS k
      WHERE (k.queue, k.key) IN (SELECT t.queue, t.key
                                   FROM ROWS FROM (pg_catalog.unnest(p_queues),
                                                   pg_catalog.unnest(p_keys)) AS t(queue, key)
                                  WHERE t.key IS NOT NULL)
      ORDER BY k.queue COLLATE "C", k.key COLLATE "C"
        FOR UPDATE OF k;
END
$fn$;

-- soniq_queue_budget_v3: a limited queue's budget, never waiting for a key's row --
-- soniq_queue_budget_v2 (claim_protocol_v8.sql) but for the lapsed holds it deletes:
-- those that keep a key's slot only when their key's row is free now.
CREATE FUNCTION {schema}.soniq_queue_budget_v3(
    p_queue text, p_wanted integer, OUT budget integer, OUT rated boolean
)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_paused boolean;
    v_concurrency integer;
    v_rate integer;
    v_period integer;
    v_now timestamptz;
    v_count bigint;
    v_held bigint;
    v_lapsed bigint;
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a claim of a queue with limits needs READ COMMITTED isolation'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    budget := p_wanted;
    rated := false;
    -- SKIP LOCKED: no wait, whoever holds the row and for however long.
    SELECT s.paused, coalesce(s.concurrency, s.configured_concurrency),
           CASE WHEN s.rate_limit IS NOT NULL THEN s.rate_limit ELSE s.configured_rate_limit END,
           CASE WHEN s.rate_limit IS NOT NULL THEN s.rate_period
                ELSE s.configured_rate_period END
      INTO v_paused, v_concurrency, v_rate, v_period
      FROM {schema}.soniq_queue_settings AS s
     WHERE s.queue = p_queue
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        -- Skipped (locked: held back) or gone (no limit any more).
        IF EXISTS (SELECT 1 FROM {schema}.soniq_queue_settings AS s WHERE s.queue = p_queue) THEN
            budget := 0;
        END IF;
        RETURN;
    END IF;
    IF v_paused THEN
        budget := 0;
        RETURN;
    END IF;
    IF v_concurrency IS NOT NULL THEN
        v_now := pg_catalog.clock_timestamp();  -- after the lock
        SELECT pg_catalog.count(*) INTO v_count
          FROM {schema}.soniq_jobs AS j
         WHERE j.status = 'processing' AND j.queue = p_queue;
        SELECT pg_catalog.count(*) FILTER (WHERE h.lease_expires_at > v_now),
               pg_catalog.count(*) FILTER (WHERE h.lease_expires_at <= v_now)
          INTO v_held, v_lapsed
          FROM {schema}.soniq_queue_holds AS h
         WHERE h.queue = p_queue;
        IF v_lapsed > 0 THEN
            DELETE FROM {schema}.soniq_queue_holds AS h
             WHERE h.id IN (SELECT l.id FROM {schema}.soniq_queue_holds AS l
                             WHERE l.queue = p_queue AND l.lease_expires_at <= v_now
                               -- Version 3: a hold that keeps a key's slot only while
                               -- its key's row can be locked now (its deletion's trigger
                               -- gives the slot back under that lock): a claim never
                               -- waits for a key's row. One left is deleted by a later
                               -- claim, a timeout's hold or the sweep (soniq_key_sweep).
                               AND NOT EXISTS (
                                   SELECT 1 FROM {schema}.soniq_key_holds AS kh
                                    WHERE kh.job_id = l.job_id AND kh.generation = l.generation
                                      AND NOT EXISTS (
                                          SELECT 1 FROM {schema}.soniq_key_slots AS ks
                                           WHERE ks.queue = kh.queue AND ks.key = kh.key
                                             FOR UPDATE SKIP LOCKED))
                               FOR UPDATE SKIP LOCKED);
        END IF;
        budget := LEAST(budget, v_concurrency - v_count - v_held);
    END IF;
    IF v_rate IS NOT NULL THEN
        rated := true;
        v_now := pg_catalog.clock_timestamp();  -- after the lock
        DELETE FROM {schema}.soniq_queue_starts AS t
         WHERE t.queue = p_queue
           AND t.started_at <= v_now - pg_catalog.make_interval(secs => v_period);
        SELECT pg_catalog.count(*) INTO v_count
          FROM {schema}.soniq_queue_starts AS t WHERE t.queue = p_queue;
        budget := LEAST(budget, v_rate - v_count);
    END IF;
    budget := GREATEST(budget, 0);
END
$fn$;

-- soniq_claim_many (version 13 body; same signature, settings of version 11) --
CREATE OR REPLACE FUNCTION {schema}.soniq_claim_many(
    worker_id text,
    claim_tokens text[],
    queues text[] DEFAULT NULL,
    lease_seconds double precision DEFAULT 30,
    result_ttl_seconds double precision DEFAULT 300,
    pid integer DEFAULT NULL
) RETURNS TABLE (
    job_id uuid, job_name text, args jsonb, queue text, priority integer, attempts integer,
    max_attempts integer, lease_expires_at timestamptz, generation bigint,
    owner text, token text
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_sort = off
SET jit = off
AS $fn$
#variable_conflict use_column
DECLARE
    p_owner text := soniq_claim_many.worker_id;
    p_tokens text[] := soniq_claim_many.claim_tokens;
    p_queues text[] := soniq_claim_many.queues;
    p_lease double precision := soniq_claim_many.lease_seconds;
    p_ttl double precision := soniq_claim_many.result_ttl_seconds;
    v_wanted integer;
    v_ids uuid[];
    v_tids tid[];
    v_generations bigint[];
    v_worker uuid;
    v_now timestamptz;
    v_token text;
    v_i integer;
    v_count integer;
    v_written integer;
    v_top_generation bigint;
    v_paused text[];
    v_limited text[];
    v_rated text[];
    v_skip text[];
    v_queue text;
    v_budget integer;
    v_is_rated boolean;
    v_first_due timestamptz;
    v_any_due boolean;
    v_keys text[];
    v_held uuid[];
    s_queues text[];
    s_limits integer[];
    r record;
    -- Version 9: where the last probes stopped (see the header of claim_protocol_v9.sql).
    v_clock timestamptz := pg_catalog.clock_timestamp();
    v_table text := {schema_literal};  -- the scope of the hints: this schema's soniq_jobs
    v_hint text;
    v_lapsed_after timestamptz;
    v_lapsed_full timestamptz;
    v_index oid;
    v_scope text;
    v_hinted boolean := false;
    v_hint_priority integer;
    v_hint_created timestamptz;
    v_claim_full timestamptz;
    v_read_before bigint;
    v_first_priority integer;
    v_first_created timestamptz;
    v_suspect boolean := false;
    v_lapsed_suspect boolean := false;
BEGIN
    -- The checks are plain expressions and loops, not queries: PL/pgSQL
    -- evaluates those without starting an executor for each.
    IF p_owner IS NULL OR p_owner = '' OR pg_catalog.length(p_owner) > 255 THEN
        RAISE EXCEPTION 'worker_id must be a non-empty string of at most 255 characters'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    v_wanted := pg_catalog.cardinality(p_tokens);
    IF v_wanted IS NULL OR v_wanted < 1 OR v_wanted > 1000
       OR pg_catalog.array_ndims(p_tokens) <> 1 THEN
        RAISE EXCEPTION 'claim_tokens must hold 1 to 1000 nonces'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    FOREACH v_token IN ARRAY p_tokens LOOP
        IF v_token IS NULL OR v_token = '' OR pg_catalog.length(v_token) > 255 THEN
            RAISE EXCEPTION 'claim_token must be a non-empty string of at most 255 characters'
                USING ERRCODE = '22023', HINT = 'CONFIG';
        END IF;
    END LOOP;
    IF p_lease IS NULL OR p_lease = 'NaN'::float8 OR p_lease <= 0 OR p_lease > 31536000 THEN
        RAISE EXCEPTION 'lease_seconds is out of range' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF p_ttl IS NULL OR p_ttl = 'NaN'::float8 OR p_ttl < 0 OR p_ttl > 31536000 THEN
        RAISE EXCEPTION 'result_ttl_seconds is out of range'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF soniq_claim_many.pid IS NOT NULL AND soniq_claim_many.pid < 1 THEN
        RAISE EXCEPTION 'pid must be a positive integer' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    -- A nonce may fence one claim only: twice in this call, or used before.
    IF (v_wanted > 1 AND (SELECT pg_catalog.count(DISTINCT t.token COLLATE "C")
                            FROM pg_catalog.unnest(p_tokens) AS t(token)) <> v_wanted)
       OR EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.claim_token = ANY (p_tokens)) THEN
        RAISE EXCEPTION 'claim token was used before' USING ERRCODE = 'P0001',
            HINT = 'QUEUE_CLAIM_CONFLICT', DETAIL = 'nonce_reused';
    END IF;

    -- Settle lapsed leases first; the probe keeps the common case (nothing
    -- lapsed) to one index lookup. Version 8: the reaper that never waits
    -- for a producer (at most 5 ms a row). Version 9: a probe from the start
    -- that read more than DEAD_ENTRIES entries of soniq_jobs_lease_idx
    -- without finding a lapsed lease (a pinned horizon keeps the leases of
    -- every job finished since) makes this session's next probes, and the
    -- reaper, read only the leases that ended after the last probe that
    -- found none, less LAPSED_MARGIN, for FULL_PROBE_EVERY.
    v_hint := pg_catalog.current_setting('soniq.lapsed_hint', true);
    IF v_hint IS NOT NULL AND v_hint <> '' AND pg_catalog.split_part(v_hint, '|', 1) = v_table THEN
        IF pg_catalog.split_part(v_hint, '|', 2) = 'suspect' THEN
            v_lapsed_suspect := true;
        ELSE
            v_lapsed_full := pg_catalog.to_timestamp(pg_catalog.split_part(v_hint, '|', 3)::float8);
            IF v_clock < v_lapsed_full THEN
                v_lapsed_after := pg_catalog.to_timestamp(
                    pg_catalog.split_part(v_hint, '|', 2)::float8);
            ELSE
                v_lapsed_suspect := true;  -- hinted until now: one more such probe hints again
            END IF;
        END IF;
    END IF;
    IF v_lapsed_after IS NULL THEN
        v_index := ({schema_literal} || '.soniq_jobs_lease_idx')::regclass;
        v_read_before := pg_catalog.pg_stat_get_xact_tuples_returned(v_index);
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j
                WHERE j.status = 'processing'
                  AND j.lease_expires_at <= v_clock
                  AND j.lease_expires_at > coalesce(v_lapsed_after, '-infinity'::timestamptz)) THEN
        PERFORM {schema}.soniq_reap_lapsed_v3(10, p_ttl, v_lapsed_after);
    ELSIF v_lapsed_after IS NOT NULL THEN
        -- None lapsed up to v_clock: the next probe starts LAPSED_MARGIN before it.
        PERFORM pg_catalog.set_config('soniq.lapsed_hint', v_table || '|'
            || pg_catalog.date_part('epoch', v_clock - interval '1 second') || '|'
            || pg_catalog.date_part('epoch', v_lapsed_full), false);
    ELSIF pg_catalog.pg_stat_get_xact_tuples_returned(v_index) - v_read_before > 1000 THEN
        -- DEAD_ENTRIES read from the start, and none lapsed. Twice in a row (the first
        -- probe marks the entries it can dead, so the second reads them again only if
        -- a snapshot still needs them): hints, for FULL_PROBE_EVERY.
        IF v_lapsed_suspect THEN
            PERFORM pg_catalog.set_config('soniq.lapsed_hint', v_table || '|'
                || pg_catalog.date_part('epoch', v_clock - interval '1 second') || '|'
                || pg_catalog.date_part('epoch', v_clock + interval '30 seconds'), false);
        ELSE
            PERFORM pg_catalog.set_config('soniq.lapsed_hint', v_table || '|suspect', false);
        END IF;
    ELSIF v_hint IS NOT NULL AND v_hint <> '' THEN
        PERFORM pg_catalog.set_config('soniq.lapsed_hint', '', false);
    END IF;

    -- Flow control: the queues this claim may serve that are paused, or
    -- limited. Read without a lock; a limited queue's row is read again
    -- under its lock.
    SELECT pg_catalog.array_agg(s.queue) FILTER (WHERE s.paused),
           pg_catalog.array_agg(s.queue ORDER BY s.queue COLLATE "C") FILTER (WHERE NOT s.paused)
      INTO v_paused, v_limited
      FROM {schema}.soniq_queue_settings AS s
     WHERE (s.paused OR s.concurrency IS NOT NULL OR s.configured_concurrency IS NOT NULL
            OR s.rate_limit IS NOT NULL OR s.configured_rate_limit IS NOT NULL)
       AND (p_queues IS NULL OR s.queue = ANY (p_queues));

    -- Version 6: is any scheduled job due? The queued scheduled job that
    -- falls due first, read from soniq_jobs_claim_due_idx, answers it. When
    -- none is (the usual case), the claim reads none of the scheduled jobs.
    SELECT j.scheduled_at INTO v_first_due
      FROM {schema}.soniq_jobs AS j
     WHERE j.status = 'queued' AND j.scheduled_at IS NOT NULL
     ORDER BY j.scheduled_at
     LIMIT 1;
    v_any_due := coalesce(v_first_due <= pg_catalog.clock_timestamp(), false);

    IF p_queues IS NULL AND v_paused IS NULL AND v_limited IS NULL THEN
        -- Every queue, no flow control: version 7's two statements, one of
        -- which each claim runs. Lock the jobs first (SKIP LOCKED:
        -- concurrent claimers take different rows), in claim order. Then
        -- write them (below): a batch of one by primary key, a larger one
        -- by one UPDATE matched by the ctid read here (version 7).
        -- Version 6: while no scheduled job is due (the usual case), the
        -- candidates are the first unscheduled jobs in claim order, from
        -- soniq_jobs_claim_now_idx, which holds no scheduled job. When one
        -- is due, also the first due scheduled jobs in claim order, from
        -- soniq_jobs_claim_scheduled_idx, and the first v_wanted of both
        -- are claimed; the candidates not taken stay locked (unchanged)
        -- until this transaction ends. Nothing is held back, so no scan
        -- reads past a job this claim could not take.
        IF NOT v_any_due THEN
            -- Version 9: from where the last claim began while the scan from
            -- the start reads too many dead entries (claim_hint, below).
            v_index := ({schema_literal} || '.soniq_jobs_claim_now_idx')::regclass;
            v_scope := v_index::text || ':*';
            v_hint := pg_catalog.current_setting('soniq.claim_hint', true);
            IF v_hint IS NOT NULL AND v_hint <> ''
               AND pg_catalog.split_part(v_hint, '|', 1) = v_scope THEN
                -- The priority of the session's last claim, in either state.
                v_hint_priority := NULLIF(pg_catalog.split_part(v_hint, '|', 3), '')::integer;
                IF pg_catalog.split_part(v_hint, '|', 2) = 'suspect' THEN
                    v_suspect := true;
                ELSE
                    v_claim_full := pg_catalog.to_timestamp(
                        pg_catalog.split_part(v_hint, '|', 2)::float8);
                    IF v_clock < v_claim_full THEN
                        v_hinted := true;
                        v_hint_created := (pg_catalog.split_part(v_hint, '|', 4) || '+00')::timestamptz;
                    ELSE
                        v_suspect := true;  -- hinted until now: one more such scan hints again
                    END IF;
                END IF;
            END IF;
            IF v_hinted THEN
                FOR r IN
                    SELECT c.id, c.tid, c.claim_generation, c.priority, c.created_at, c.behind
                      FROM (SELECT a.*, false AS behind
                              FROM (SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority,
                                           j.created_at
                                      FROM {schema}.soniq_jobs AS j
                                     WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                                       AND j.priority < v_hint_priority
                                     ORDER BY j.priority, j.created_at
                                     LIMIT v_wanted
                                       FOR UPDATE SKIP LOCKED) AS a
                            UNION ALL
                            SELECT b.*, true AS behind
                              FROM (SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority,
                                           j.created_at
                                      FROM {schema}.soniq_jobs AS j
                                     WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                                       AND (j.priority, j.created_at)
                                           >= (v_hint_priority, v_hint_created)
                                     ORDER BY j.priority, j.created_at
                                     LIMIT v_wanted
                                       FOR UPDATE SKIP LOCKED) AS b) AS c
                     ORDER BY c.priority, c.created_at, c.tid
                     LIMIT v_wanted
                LOOP
                    v_ids := v_ids || r.id;
                    v_tids := v_tids || r.tid;
                    v_generations := v_generations || r.claim_generation;
                    v_top_generation := GREATEST(v_top_generation, r.claim_generation);
                    IF r.behind AND v_first_priority IS NULL THEN
                        v_first_priority := r.priority;
                        v_first_created := r.created_at;
                    END IF;
                END LOOP;
            ELSE
                v_read_before := pg_catalog.pg_stat_get_xact_tuples_returned(v_index);
                FOR r IN
                    SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority, j.created_at
                      FROM {schema}.soniq_jobs AS j
                     WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                     ORDER BY j.priority, j.created_at
                     LIMIT v_wanted
                       FOR UPDATE SKIP LOCKED
                LOOP
                    v_ids := v_ids || r.id;
                    v_tids := v_tids || r.tid;
                    v_generations := v_generations || r.claim_generation;
                    v_top_generation := GREATEST(v_top_generation, r.claim_generation);
                    IF v_first_priority IS NULL THEN
                        v_first_priority := r.priority;
                        v_first_created := r.created_at;
                    END IF;
                END LOOP;
                -- The entries the scan read that it did not claim: dead ones
                -- (and a few locked by other claims). Past DEAD_ENTRIES, the
                -- claims start where this one began, for FULL_SCAN_EVERY.
                IF pg_catalog.pg_stat_get_xact_tuples_returned(v_index) - v_read_before
                   - coalesce(pg_catalog.cardinality(v_ids), 0) > 1000 THEN  -- DEAD_ENTRIES
                    IF v_suspect THEN  -- twice in a row: a snapshot keeps them
                        v_hinted := true;
                        v_claim_full := v_clock + interval '30 seconds';  -- FULL_SCAN_EVERY
                    ELSE
                        PERFORM pg_catalog.set_config('soniq.claim_hint', v_scope || '|suspect|'
                            || coalesce(v_first_priority::text, v_hint_priority::text, ''), false);
                    END IF;
                ELSIF v_hint IS NOT NULL AND v_hint <> '' THEN
                    PERFORM pg_catalog.set_config('soniq.claim_hint', '', false);
                END IF;
            END IF;
            IF v_hinted AND v_ids IS NULL AND v_hint_priority IS NOT NULL THEN
                -- Nothing claimed: every entry from where the scan started up to now was
                -- dead or taken, so the next scan may start at this claim's clock, less
                -- LAPSED_MARGIN, in the priority of the session's last claim.
                v_first_priority := v_hint_priority;
                v_first_created := v_clock - interval '1 second';
            END IF;
            IF v_hinted AND v_first_priority IS NOT NULL THEN
                PERFORM pg_catalog.set_config('soniq.claim_hint', v_scope || '|'
                    || pg_catalog.date_part('epoch', v_claim_full) || '|' || v_first_priority
                    || '|' || pg_catalog.to_char(v_first_created AT TIME ZONE 'UTC',
                                                 'YYYY-MM-DD HH24:MI:SS.US'), false);
            END IF;
        ELSE
            FOR r IN
                SELECT c.id, c.tid, c.claim_generation
                  FROM (SELECT n.id, n.tid, n.claim_generation, n.priority, n.created_at
                          FROM (SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority, j.created_at
                                  FROM {schema}.soniq_jobs AS j
                                 WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                                 ORDER BY j.priority, j.created_at
                                 LIMIT v_wanted
                                   FOR UPDATE SKIP LOCKED) AS n
                        UNION ALL
                        SELECT d.id, d.tid, d.claim_generation, d.priority, d.created_at
                          FROM (SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority, j.created_at
                                  FROM {schema}.soniq_jobs AS j
                                 WHERE j.status = 'queued' AND j.scheduled_at IS NOT NULL
                                   AND j.scheduled_at <= pg_catalog.clock_timestamp()
                                 ORDER BY j.priority, j.created_at
                                 LIMIT v_wanted
                                   FOR UPDATE SKIP LOCKED) AS d) AS c
                 ORDER BY c.priority, c.created_at
                 LIMIT v_wanted
            LOOP
                v_ids := v_ids || r.id;
                v_tids := v_tids || r.tid;
                v_generations := v_generations || r.claim_generation;
                v_top_generation := GREATEST(v_top_generation, r.claim_generation);
            END LOOP;
        END IF;
    ELSE
        -- The queues to scan (s_queues) and how many jobs each may give
        -- (s_limits). First those served freely, each up to v_wanted: named
        -- by the caller, or (every queue) those with a queued job, found by
        -- skipping through soniq_jobs_claim_idx one queue at a time. Each
        -- is named once: a queue scanned twice would give its rows twice.
        IF v_paused IS NULL AND v_limited IS NULL AND pg_catalog.cardinality(p_queues) = 1 THEN
            -- One queue named, nothing held back (a worker of one queue): no
            -- query, no merge.
            s_queues := p_queues;
            s_limits := ARRAY[v_wanted];
        ELSE
            v_skip := coalesce(v_paused, '{}'::text[]) || coalesce(v_limited, '{}'::text[]);
            IF p_queues IS NOT NULL THEN
                s_queues := ARRAY(SELECT DISTINCT q.name FROM pg_catalog.unnest(p_queues) AS q(name)
                                   WHERE q.name <> ALL (v_skip));
            ELSE
                s_queues := ARRAY(
                    WITH RECURSIVE found(name) AS (
                        (SELECT j.queue FROM {schema}.soniq_jobs AS j
                          WHERE j.status = 'queued' ORDER BY j.queue LIMIT 1)
                        UNION ALL
                        SELECT (SELECT j.queue FROM {schema}.soniq_jobs AS j
                                 WHERE j.status = 'queued' AND j.queue > f.name
                                 ORDER BY j.queue LIMIT 1)
                          FROM found AS f WHERE f.name IS NOT NULL)
                    SELECT f.name FROM found AS f
                     WHERE f.name IS NOT NULL AND f.name <> ALL (v_skip));
            END IF;
            s_limits := pg_catalog.array_fill(v_wanted, ARRAY[pg_catalog.cardinality(s_queues)]);
            -- Version 8: then each limited queue with a due job, at most its
            -- budget, known before any job is locked. soniq_queue_budget_v2
            -- (version 13: _v3, which never waits for a key's row either)
            -- never waits for the queue's settings row: a row locked elsewhere
            -- gives 0, and the queue is held back for this claim. (Version 7
            -- locked the free queues' jobs first, then waited for the row while
            -- holding them, so that a claimer of the free queues alone found
            -- them taken.) A queue with nothing due takes no lock.
            -- (Each probe reads the queue's own jobs only: the queue as a range
            -- of one value, as in the scans below.)
            FOREACH v_queue IN ARRAY coalesce(v_limited, '{}'::text[]) LOOP
                IF NOT v_any_due THEN
                    CONTINUE WHEN NOT EXISTS (
                        SELECT 1 FROM {schema}.soniq_jobs AS j
                         WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                           AND j.queue >= v_queue AND j.queue <= v_queue);
                ELSE
                    CONTINUE WHEN NOT EXISTS (
                        SELECT 1 FROM {schema}.soniq_jobs AS j
                         WHERE j.status = 'queued'
                           AND j.queue >= v_queue AND j.queue <= v_queue
                           AND (j.scheduled_at IS NULL
                                OR j.scheduled_at <= pg_catalog.clock_timestamp()));
                END IF;
                SELECT b.budget, b.rated INTO v_budget, v_is_rated
                  FROM {schema}.soniq_queue_budget_v3(v_queue, v_wanted) AS b;
                IF v_is_rated THEN
                    v_rated := v_rated || v_queue;
                END IF;
                CONTINUE WHEN v_budget < 1;
                s_queues := s_queues || v_queue;
                s_limits := s_limits || v_budget;
            END LOOP;
        END IF;
        -- Version 8: one scan per queue, each in claim order from an index
        -- that starts with the queue, so that no scan reads a row of a queue
        -- this claim does not serve (version 7 filtered the queue on an
        -- index of every queue, and walked past the backlogs held back).
        -- While no scheduled job is due: the unscheduled jobs, from
        -- soniq_jobs_claim_queue_now_idx. When one is: the unscheduled and
        -- the due scheduled jobs, from soniq_jobs_claim_idx (that scan reads
        -- past the queue's own jobs scheduled for later that come before
        -- them, never another queue's). Each scan locks (SKIP LOCKED) at
        -- most its queue's limit; the first v_wanted of all in claim order
        -- are claimed, ties in (priority, created_at) in the order of the
        -- rows in the table, as one scan of every queue would take them.
        -- Each scan names its queue as a range of one value (>= and <=: the
        -- rows = would match, under the deterministic collations the
        -- admission checks require) and orders by the queue first (one
        -- value, so that is claim order). An equality would tell the planner
        -- that the queue is fixed, and with statistics that see one big
        -- queue, a scan of soniq_jobs_claim_now_idx filtering the queue then
        -- looks as cheap -- and reads the whole backlog (measured: 100,000
        -- rows removed by the filter). A range and that order leave it the
        -- indexes that start with the queue.
        IF pg_catalog.cardinality(s_queues) = 1 THEN
            -- One queue (a worker of one queue, say): its scan alone.
            IF NOT v_any_due THEN
                -- Version 9: as the claim of every queue above, the queue's
                -- scan starts where the last claim of it began while a scan
                -- from the start reads too many dead entries.
                v_index := ({schema_literal} || '.soniq_jobs_claim_queue_now_idx')::regclass;
                v_scope := v_index::text || ':' || pg_catalog.md5(s_queues[1]);
                v_hint := pg_catalog.current_setting('soniq.claim_hint', true);
                IF v_hint IS NOT NULL AND v_hint <> ''
                   AND pg_catalog.split_part(v_hint, '|', 1) = v_scope THEN
                    -- The priority of the session's last claim, in either state.
                    v_hint_priority := NULLIF(pg_catalog.split_part(v_hint, '|', 3), '')::integer;
                    IF pg_catalog.split_part(v_hint, '|', 2) = 'suspect' THEN
                        v_suspect := true;
                    ELSE
                        v_claim_full := pg_catalog.to_timestamp(
                            pg_catalog.split_part(v_hint, '|', 2)::float8);
                        IF v_clock < v_claim_full THEN
                            v_hinted := true;
                            v_hint_created := (pg_catalog.split_part(v_hint, '|', 4) || '+00')::timestamptz;
                        ELSE
                            v_suspect := true;  -- hinted until now: one more such scan hints again
                        END IF;
                    END IF;
                END IF;
                IF v_hinted THEN
                    FOR r IN
                        SELECT c.id, c.tid, c.claim_generation, c.priority, c.created_at, c.behind
                          FROM (SELECT a.*, false AS behind
                                  FROM (SELECT j.id, j.ctid AS tid, j.claim_generation,
                                               j.priority, j.created_at
                                          FROM {schema}.soniq_jobs AS j
                                         WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                                           AND j.queue >= s_queues[1] AND j.queue <= s_queues[1]
                                           AND j.priority < v_hint_priority
                                         ORDER BY j.queue, j.priority, j.created_at
                                         LIMIT s_limits[1]
                                           FOR UPDATE SKIP LOCKED) AS a
                                UNION ALL
                                SELECT b.*, true AS behind
                                  FROM (SELECT j.id, j.ctid AS tid, j.claim_generation,
                                               j.priority, j.created_at
                                          FROM {schema}.soniq_jobs AS j
                                         WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                                           AND (j.queue, j.priority, j.created_at)
                                               >= (s_queues[1], v_hint_priority, v_hint_created)
                                           AND j.queue <= s_queues[1]
                                         ORDER BY j.queue, j.priority, j.created_at
                                         LIMIT s_limits[1]
                                           FOR UPDATE SKIP LOCKED) AS b) AS c
                         ORDER BY c.priority, c.created_at, c.tid
                         LIMIT s_limits[1]
                    LOOP
                        v_ids := v_ids || r.id;
                        v_tids := v_tids || r.tid;
                        v_generations := v_generations || r.claim_generation;
                        v_top_generation := GREATEST(v_top_generation, r.claim_generation);
                        IF r.behind AND v_first_priority IS NULL THEN
                            v_first_priority := r.priority;
                            v_first_created := r.created_at;
                        END IF;
                    END LOOP;
                ELSE
                    v_read_before := pg_catalog.pg_stat_get_xact_tuples_returned(v_index);
                    FOR r IN
                        SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority, j.created_at
                          FROM {schema}.soniq_jobs AS j
                         WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                           AND j.queue >= s_queues[1] AND j.queue <= s_queues[1]
                         ORDER BY j.queue, j.priority, j.created_at
                         LIMIT s_limits[1]
                           FOR UPDATE SKIP LOCKED
                    LOOP
                        v_ids := v_ids || r.id;
                        v_tids := v_tids || r.tid;
                        v_generations := v_generations || r.claim_generation;
                        v_top_generation := GREATEST(v_top_generation, r.claim_generation);
                        IF v_first_priority IS NULL THEN
                            v_first_priority := r.priority;
                            v_first_created := r.created_at;
                        END IF;
                    END LOOP;
                    IF pg_catalog.pg_stat_get_xact_tuples_returned(v_index) - v_read_before
                       - coalesce(pg_catalog.cardinality(v_ids), 0) > 1000 THEN  -- DEAD_ENTRIES
                        IF v_suspect THEN  -- twice in a row: a snapshot keeps them
                            v_hinted := true;
                            v_claim_full := v_clock + interval '30 seconds';  -- FULL_SCAN_EVERY
                        ELSE
                            PERFORM pg_catalog.set_config('soniq.claim_hint', v_scope || '|suspect|'
                                || coalesce(v_first_priority::text, v_hint_priority::text, ''), false);
                        END IF;
                    ELSIF v_hint IS NOT NULL AND v_hint <> '' THEN
                        PERFORM pg_catalog.set_config('soniq.claim_hint', '', false);
                    END IF;
                END IF;
                IF v_hinted AND v_ids IS NULL AND v_hint_priority IS NOT NULL THEN
                    -- Nothing claimed: every entry from where the scan started up to now was
                    -- dead or taken, so the next scan may start at this claim's clock, less
                    -- LAPSED_MARGIN, in the priority of the session's last claim.
                    v_first_priority := v_hint_priority;
                    v_first_created := v_clock - interval '1 second';
                END IF;
                IF v_hinted AND v_first_priority IS NOT NULL THEN
                    PERFORM pg_catalog.set_config('soniq.claim_hint', v_scope || '|'
                        || pg_catalog.date_part('epoch', v_claim_full) || '|' || v_first_priority
                        || '|' || pg_catalog.to_char(v_first_created AT TIME ZONE 'UTC',
                                                     'YYYY-MM-DD HH24:MI:SS.US'), false);
                END IF;
            ELSE
                FOR r IN
                    SELECT j.id, j.ctid AS tid, j.claim_generation
                      FROM {schema}.soniq_jobs AS j
                     WHERE j.status = 'queued'
                       AND j.queue >= s_queues[1] AND j.queue <= s_queues[1]
                       AND (j.scheduled_at IS NULL
                            OR j.scheduled_at <= pg_catalog.clock_timestamp())
                     ORDER BY j.queue, j.priority, j.created_at
                     LIMIT s_limits[1]
                       FOR UPDATE SKIP LOCKED
                LOOP
                    v_ids := v_ids || r.id;
                    v_tids := v_tids || r.tid;
                    v_generations := v_generations || r.claim_generation;
                    v_top_generation := GREATEST(v_top_generation, r.claim_generation);
                END LOOP;
            END IF;
        ELSIF pg_catalog.cardinality(s_queues) > 1 THEN
            -- Several: one scan each (LATERAL), merged.
            IF NOT v_any_due THEN
                FOR r IN
                    SELECT k.id, k.tid, k.claim_generation
                      FROM ROWS FROM (pg_catalog.unnest(s_queues),
                                      pg_catalog.unnest(s_limits)) AS q(name, most)
                     CROSS JOIN LATERAL (
                           SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority,
                                  j.created_at
                             FROM {schema}.soniq_jobs AS j
                            WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                              AND j.queue >= q.name AND j.queue <= q.name
                            ORDER BY j.queue, j.priority, j.created_at
                            LIMIT q.most
                              FOR UPDATE SKIP LOCKED) AS k
                     ORDER BY k.priority, k.created_at, k.tid
                     LIMIT v_wanted
                LOOP
                    v_ids := v_ids || r.id;
                    v_tids := v_tids || r.tid;
                    v_generations := v_generations || r.claim_generation;
                    v_top_generation := GREATEST(v_top_generation, r.claim_generation);
                END LOOP;
            ELSE
                FOR r IN
                    SELECT k.id, k.tid, k.claim_generation
                      FROM ROWS FROM (pg_catalog.unnest(s_queues),
                                      pg_catalog.unnest(s_limits)) AS q(name, most)
                     CROSS JOIN LATERAL (
                           SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority,
                                  j.created_at
                             FROM {schema}.soniq_jobs AS j
                            WHERE j.status = 'queued'
                              AND j.queue >= q.name AND j.queue <= q.name
                              AND (j.scheduled_at IS NULL
                                   OR j.scheduled_at <= pg_catalog.clock_timestamp())
                            ORDER BY j.queue, j.priority, j.created_at
                            LIMIT q.most
                              FOR UPDATE SKIP LOCKED) AS k
                     ORDER BY k.priority, k.created_at, k.tid
                     LIMIT v_wanted
                LOOP
                    v_ids := v_ids || r.id;
                    v_tids := v_tids || r.tid;
                    v_generations := v_generations || r.claim_generation;
                    v_top_generation := GREATEST(v_top_generation, r.claim_generation);
                END LOOP;
            END IF;
        END IF;
    END IF;
    -- Version 13: a claim never waits for a key's row. A candidate limited
    -- per key (an offered job, docs/keys.md) is claimed only when its key's
    -- row can be locked now (SKIP LOCKED; a row this transaction holds
    -- already, by a completion of the same round, is taken): its trigger
    -- (soniq_key_moved_v1) then works under that lock without waiting. One
    -- whose key's row another transaction holds (a round ending a job of the
    -- key, a producer enqueueing one) is left, locked and unchanged until this
    -- transaction ends, as the candidates not taken are, for a later claim.
    -- So no claim is part of a cycle of waits on key rows; the ending writes
    -- wait for them in key order (soniq_key_lock_v1). The candidates' keys
    -- are read again by ctid (locked here, so unchanged): one TID scan that
    -- filters nothing out, and no key's row read when none has a key.
    IF v_ids IS NOT NULL THEN
        SELECT pg_catalog.array_agg(j.concurrency_key) INTO v_keys
          FROM {schema}.soniq_jobs AS j
         WHERE j.ctid = ANY (v_tids);
        IF pg_catalog.cardinality(pg_catalog.array_remove(v_keys, NULL)) > 0 THEN
            -- Held elsewhere: the key's row exists and cannot be locked now.
            SELECT pg_catalog.array_agg(j.id) INTO v_held
              FROM {schema}.soniq_jobs AS j
             WHERE j.ctid = ANY (v_tids) AND j.concurrency_key IS NOT NULL
               AND EXISTS (SELECT 1 FROM {schema}.soniq_key_slots AS k
                            WHERE k.queue = j.queue AND k.key = j.concurrency_key)
               AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_key_slots AS k
                                WHERE k.queue = j.queue AND k.key = j.concurrency_key
                                  FOR UPDATE SKIP LOCKED);
        END IF;
        IF v_held IS NOT NULL THEN
            SELECT pg_catalog.array_agg(c.id ORDER BY c.i), pg_catalog.array_agg(c.tid ORDER BY c.i),
                   pg_catalog.array_agg(c.generation ORDER BY c.i), pg_catalog.max(c.generation)
              INTO v_ids, v_tids, v_generations, v_top_generation
              FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_tids),
                              pg_catalog.unnest(v_generations)) WITH ORDINALITY
                   AS c(id, tid, generation, i)
             WHERE c.id <> ALL (v_held);
        END IF;
    END IF;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    IF v_top_generation >= 9223372036854775807 THEN
        RAISE EXCEPTION 'claim generation is exhausted' USING ERRCODE = 'P0001',
            HINT = 'QUEUE_CLAIM_CONFLICT', DETAIL = 'generation_exhausted';
    END IF;

    -- worker_id names a soniq_workers row (Soniq declares a foreign key
    -- there): set only when the owner is a registered worker.
    IF p_owner ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$' THEN
        SELECT w.id INTO v_worker FROM {schema}.soniq_workers AS w WHERE w.id = p_owner::uuid;
    END IF;

    v_now := pg_catalog.clock_timestamp();  -- after the locks
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    v_count := pg_catalog.cardinality(v_ids);
    IF v_count = 1 THEN
        -- One job: one UPDATE by primary key, as version 6 (measured cheaper
        -- than the set-based write for a batch of one).
        FOR v_i IN 1 .. pg_catalog.cardinality(v_ids) LOOP
            UPDATE {schema}.soniq_jobs AS j
               SET status = 'processing',
                   attempts = j.attempts + 1,
                   claim_generation = j.claim_generation + 1,
                   claim_owner = p_owner,
                   claim_token = p_tokens[v_i],
                   worker_id = v_worker,
                   lease_expires_at = v_now + pg_catalog.make_interval(secs => p_lease),
                   cancel_requested = false,
                   pid = soniq_claim_many.pid,
                   updated_at = v_now,
                   claimed_at = v_now
             WHERE j.id = v_ids[v_i]
            RETURNING j.id, j.job_name, j.args, j.queue, j.priority, j.attempts,
                      j.max_attempts, j.lease_expires_at, j.claim_generation,
                      j.claim_owner, j.claim_token
                 INTO r;
            IF r.claim_owner IS NULL OR r.claim_owner COLLATE "C" <> p_owner COLLATE "C"
               OR r.claim_token IS NULL OR r.claim_token COLLATE "C" <> p_tokens[v_i] COLLATE "C"
               OR r.claim_generation IS DISTINCT FROM v_generations[v_i] + 1 THEN
                RAISE EXCEPTION 'the stored claim identity differs from the one sent'
                    USING ERRCODE = 'P0001', HINT = 'QUEUE_CLAIM_CONFLICT',
                          DETAIL = 'claim_identity_changed';
            END IF;
            IF v_rated IS NOT NULL AND r.queue = ANY (v_rated) THEN
                INSERT INTO {schema}.soniq_queue_starts (queue, started_at) VALUES (r.queue, v_now);
            END IF;
            job_id := r.id; job_name := r.job_name; args := r.args; queue := r.queue;
            priority := r.priority; attempts := r.attempts; max_attempts := r.max_attempts;
            lease_expires_at := r.lease_expires_at; generation := r.claim_generation;
            owner := r.claim_owner; token := r.claim_token;
            RETURN NEXT;
        END LOOP;
    ELSE
        -- Version 7: several jobs, one UPDATE. The rows are the ones locked
        -- above (by this transaction, so their ctid cannot change before it
        -- ends), matched by ctid and id; the i-th in claim order gets the
        -- nonce p_tokens[i]. The identity check is version 6's, row by row,
        -- and every locked row must come back.
        v_written := 0;
        FOR r IN
            WITH w AS (
                UPDATE {schema}.soniq_jobs AS j
                   SET status = 'processing',
                       attempts = j.attempts + 1,
                       claim_generation = j.claim_generation + 1,
                       claim_owner = p_owner,
                       claim_token = c.token,
                       worker_id = v_worker,
                       lease_expires_at = v_now + pg_catalog.make_interval(secs => p_lease),
                       cancel_requested = false,
                       pid = soniq_claim_many.pid,
                       updated_at = v_now,
                       claimed_at = v_now
                  FROM ROWS FROM (pg_catalog.unnest(v_tids), pg_catalog.unnest(v_ids),
                                  pg_catalog.unnest(v_generations),
                                  pg_catalog.unnest(p_tokens[1:v_count]))
                       WITH ORDINALITY AS c(tid, id, generation, token, i)
                 WHERE j.ctid = c.tid AND (j.id = c.id) IS TRUE
                RETURNING c.i, c.generation AS locked_generation, c.token AS sent_token,
                          j.id, j.job_name, j.args, j.queue, j.priority, j.attempts,
                          j.max_attempts, j.lease_expires_at, j.claim_generation,
                          j.claim_owner, j.claim_token)
            SELECT * FROM w ORDER BY w.i
        LOOP
            v_written := v_written + 1;
            IF r.i IS DISTINCT FROM v_written
               OR r.claim_owner IS NULL OR r.claim_owner COLLATE "C" <> p_owner COLLATE "C"
               OR r.claim_token IS NULL OR r.claim_token COLLATE "C" <> r.sent_token COLLATE "C"
               OR r.claim_generation IS DISTINCT FROM r.locked_generation + 1 THEN
                RAISE EXCEPTION 'the stored claim identity differs from the one sent'
                    USING ERRCODE = 'P0001', HINT = 'QUEUE_CLAIM_CONFLICT',
                          DETAIL = 'claim_identity_changed';
            END IF;
            IF v_rated IS NOT NULL AND r.queue = ANY (v_rated) THEN
                INSERT INTO {schema}.soniq_queue_starts (queue, started_at) VALUES (r.queue, v_now);
            END IF;
            job_id := r.id; job_name := r.job_name; args := r.args; queue := r.queue;
            priority := r.priority; attempts := r.attempts; max_attempts := r.max_attempts;
            lease_expires_at := r.lease_expires_at; generation := r.claim_generation;
            owner := r.claim_owner; token := r.claim_token;
            RETURN NEXT;
        END LOOP;
        IF v_written <> v_count THEN
            RAISE EXCEPTION 'the stored claim identity differs from the one sent'
                USING ERRCODE = 'P0001', HINT = 'QUEUE_CLAIM_CONFLICT',
                      DETAIL = 'claim_identity_changed';
        END IF;
    END IF;
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
END
$fn$;

-- soniq_complete_many (version 13 body; same signature) --
CREATE OR REPLACE FUNCTION {schema}.soniq_complete_many(
    job_ids text[], worker_id text, generations bigint[], claim_tokens text[], queues text[],
    results jsonb[], result_ttl_seconds double precision DEFAULT 300
) RETURNS boolean[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_ids text[] := soniq_complete_many.job_ids;
    p_owner text := soniq_complete_many.worker_id;
    p_generations bigint[] := soniq_complete_many.generations;
    p_tokens text[] := soniq_complete_many.claim_tokens;
    p_queues text[] := soniq_complete_many.queues;
    p_results jsonb[] := soniq_complete_many.results;
    p_ttl double precision := soniq_complete_many.result_ttl_seconds;
    v_count integer := pg_catalog.cardinality(p_ids);
    v_done boolean[];
    v_now timestamptz;
    v_i integer;
    v_ids uuid[];
    v_hits bigint[];
    l_tids tid[];
    l_ids uuid[];
    l_queues text[];
    l_owners text[];
    l_generations bigint[];
    l_tokens text[];
    l_statuses text[];
    l_leases timestamptz[];
    l_cancels boolean[];
    l_key_queues text[];
    l_keys text[];
    r record;
BEGIN
    IF p_ttl IS NULL OR p_ttl = 'NaN'::float8 OR p_ttl < 0 OR p_ttl > 31536000 THEN
        RAISE EXCEPTION 'result_ttl_seconds is out of range'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF p_owner IS NULL OR p_owner = '' OR pg_catalog.length(p_owner) > 255 THEN
        RAISE EXCEPTION 'worker_id must be a non-empty string of at most 255 characters'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF v_count IS NULL OR v_count < 1 OR v_count > 1000
       OR pg_catalog.array_ndims(p_ids) <> 1
       OR pg_catalog.array_ndims(p_generations) IS DISTINCT FROM 1
       OR pg_catalog.array_ndims(p_tokens) IS DISTINCT FROM 1
       OR pg_catalog.array_ndims(p_queues) IS DISTINCT FROM 1
       OR pg_catalog.array_ndims(p_results) IS DISTINCT FROM 1
       OR pg_catalog.cardinality(p_generations) <> v_count
       OR pg_catalog.cardinality(p_tokens) <> v_count
       OR pg_catalog.cardinality(p_queues) <> v_count
       OR pg_catalog.cardinality(p_results) <> v_count
       OR pg_catalog.array_lower(p_ids, 1) <> 1
       OR pg_catalog.array_lower(p_generations, 1) <> 1
       OR pg_catalog.array_lower(p_tokens, 1) <> 1
       OR pg_catalog.array_lower(p_queues, 1) <> 1
       OR pg_catalog.array_lower(p_results, 1) <> 1 THEN
        RAISE EXCEPTION 'job_ids, generations, claim_tokens, queues and results must be arrays of one length, 1 to 1000'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    FOR v_i IN 1 .. v_count LOOP
        IF p_tokens[v_i] IS NULL OR p_tokens[v_i] = '' OR pg_catalog.length(p_tokens[v_i]) > 255 THEN
            RAISE EXCEPTION 'claim_token must be a non-empty string of at most 255 characters'
                USING ERRCODE = '22023', HINT = 'CONFIG';
        END IF;
        IF p_generations[v_i] IS NULL OR p_generations[v_i] < 1 OR p_queues[v_i] IS NULL
           OR p_ids[v_i] IS NULL THEN
            RAISE EXCEPTION 'invalid fence' USING ERRCODE = '22023', HINT = 'CONFIG';
        END IF;
    END LOOP;

    v_done := pg_catalog.array_fill(false, ARRAY[v_count]);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    IF v_count = 1 THEN
        -- One job: version 2's path (measured cheaper for a batch of one).
        FOR v_i IN
            SELECT o.i FROM pg_catalog.unnest(p_ids) WITH ORDINALITY AS o(id, i)
             ORDER BY o.id COLLATE "C", o.i
        LOOP
            SELECT j.id, j.queue, j.claim_owner, j.claim_generation, j.claim_token, j.status,
                   j.lease_expires_at, j.cancel_requested
              INTO r
              FROM {schema}.soniq_jobs AS j
             WHERE j.id = p_ids[v_i]::uuid
               FOR UPDATE;
            v_now := pg_catalog.clock_timestamp();  -- after the lock
            IF NOT FOUND
               OR r.id::text COLLATE "C" <> p_ids[v_i] COLLATE "C"
               OR r.queue COLLATE "C" <> p_queues[v_i] COLLATE "C"
               OR r.claim_owner IS NULL OR r.claim_owner COLLATE "C" <> p_owner COLLATE "C"
               OR r.claim_token IS NULL OR r.claim_token COLLATE "C" <> p_tokens[v_i] COLLATE "C"
               OR r.claim_generation <> p_generations[v_i]
               OR r.status <> 'processing'
               OR r.lease_expires_at IS NULL OR r.lease_expires_at <= v_now
               OR r.cancel_requested THEN
                CONTINUE;
            END IF;
            UPDATE {schema}.soniq_jobs AS j
               SET status = 'done', result = p_results[v_i],
                   lease_expires_at = NULL, pid = NULL,
                   expires_at = v_now + pg_catalog.make_interval(secs => p_ttl),
                   updated_at = v_now
             WHERE j.id = r.id
               AND (j.claim_token = p_tokens[v_i]
                    AND j.claim_generation = p_generations[v_i]
                    AND j.status = 'processing' AND j.lease_expires_at > v_now
                    AND NOT j.cancel_requested) IS TRUE;
            v_done[v_i] := FOUND;
        END LOOP;
    ELSE
        -- Version 7: several jobs, two statements. First lock every row the
        -- batch names, in id order (the order version 2 locks them in, so
        -- two batches sharing rows cannot deadlock), and read each fence
        -- under its lock.
        v_ids := p_ids::uuid[];
        SELECT pg_catalog.array_agg(k.tid), pg_catalog.array_agg(k.id),
               pg_catalog.array_agg(k.queue), pg_catalog.array_agg(k.claim_owner),
               pg_catalog.array_agg(k.claim_generation), pg_catalog.array_agg(k.claim_token),
               pg_catalog.array_agg(k.status), pg_catalog.array_agg(k.lease_expires_at),
               pg_catalog.array_agg(k.cancel_requested),
               pg_catalog.array_agg(k.queue) FILTER (WHERE k.concurrency_key IS NOT NULL
                                                      AND k.status = 'processing'),
               pg_catalog.array_agg(k.concurrency_key) FILTER (WHERE k.concurrency_key IS NOT NULL
                                                                AND k.status = 'processing')
          INTO l_tids, l_ids, l_queues, l_owners, l_generations, l_tokens, l_statuses,
               l_leases, l_cancels, l_key_queues, l_keys
          FROM (SELECT j.ctid AS tid, j.id, j.queue, j.claim_owner, j.claim_generation,
                       j.claim_token, j.status, j.lease_expires_at, j.cancel_requested,
                       j.concurrency_key
                  FROM {schema}.soniq_jobs AS j
                 WHERE j.id = ANY (v_ids)
                 ORDER BY j.id
                   FOR UPDATE) AS k;
        -- Version 13: then the rows of the keys of the running jobs among them,
        -- in key order, before any trigger runs: each row's trigger
        -- (soniq_key_moved_v1) locks its key's row, and in the order the rows
        -- are written two batches sharing keys could each hold one the other
        -- waits for. A batch without keyed jobs reads no key.
        IF l_keys IS NOT NULL THEN
            PERFORM {schema}.soniq_key_lock_v1(l_key_queues, l_keys);
        END IF;
        v_now := pg_catalog.clock_timestamp();  -- after the locks
        -- Then one UPDATE. Each element is checked against its own whole
        -- fence as version 2 checks it, against the row as locked and the
        -- time read after every lock; of the elements naming one row, the
        -- first (in input order) whose fence holds is the one written, as
        -- version 2's loop (which takes them in that order, and after
        -- whose write the row is no longer processing) writes it. The rows
        -- are matched by the ctid read under the lock, which cannot change
        -- before this transaction ends. The predicate is repeated on the
        -- row written, as one IS TRUE: the planner takes no index for it.
        WITH w AS (
            UPDATE {schema}.soniq_jobs AS j
               SET status = 'done', result = u.result,
                   lease_expires_at = NULL, pid = NULL,
                   expires_at = v_now + pg_catalog.make_interval(secs => p_ttl),
                   updated_at = v_now
              FROM (SELECT DISTINCT ON (l.id) l.tid, o.i, o.token, o.generation, o.result
                      FROM ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_generations),
                                      pg_catalog.unnest(p_tokens), pg_catalog.unnest(p_queues),
                                      pg_catalog.unnest(p_results))
                           WITH ORDINALITY AS o(id, generation, token, queue, result, i)
                      JOIN ROWS FROM (pg_catalog.unnest(l_tids), pg_catalog.unnest(l_ids),
                                      pg_catalog.unnest(l_queues), pg_catalog.unnest(l_owners),
                                      pg_catalog.unnest(l_generations),
                                      pg_catalog.unnest(l_tokens), pg_catalog.unnest(l_statuses),
                                      pg_catalog.unnest(l_leases), pg_catalog.unnest(l_cancels))
                           AS l(tid, id, queue, claim_owner, claim_generation, claim_token,
                                status, lease_expires_at, cancel_requested)
                        ON l.id::text COLLATE "C" = o.id COLLATE "C"
                     WHERE (l.queue COLLATE "C" = o.queue COLLATE "C"
                            AND l.claim_owner COLLATE "C" = p_owner COLLATE "C"
                            AND l.claim_token COLLATE "C" = o.token COLLATE "C"
                            AND l.claim_generation = o.generation
                            AND l.status = 'processing'
                            AND l.lease_expires_at > v_now
                            AND NOT l.cancel_requested) IS TRUE
                     ORDER BY l.id, o.i) AS u
             WHERE j.ctid = u.tid
               AND (j.claim_token = u.token
                    AND j.claim_generation = u.generation
                    AND j.status = 'processing' AND j.lease_expires_at > v_now
                    AND NOT j.cancel_requested) IS TRUE
            RETURNING u.i)
        SELECT pg_catalog.array_agg(w.i) INTO v_hits FROM w;
        IF v_hits IS NOT NULL THEN
            FOREACH v_i IN ARRAY v_hits LOOP
                v_done[v_i] := true;
            END LOOP;
        END IF;
    END IF;
    -- Version 8: the gate closes before returning, as version 2's did
    -- (version 7 left it open for the rest of the caller's transaction, so
    -- that an id-only DELETE of an owned submission then went through). An
    -- error on the way undoes the setting with everything else.
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
    RETURN v_done;
END
$fn$;

-- soniq_hold_slot (version 13 body; same signature) --
CREATE OR REPLACE FUNCTION {schema}.soniq_hold_slot(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    lease_seconds double precision DEFAULT 30
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_queues text[];
    v_keys text[];
BEGIN
    PERFORM {schema}.soniq_check_seconds_v1(lease_seconds, 'lease_seconds', false);
    -- Locks the row, then reads the clock: the whole fence is compared after the lock.
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_hold_slot.job_id, soniq_hold_slot.worker_id, soniq_hold_slot.generation,
        soniq_hold_slot.claim_token, soniq_hold_slot.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    -- Version 13: the rows of the keys whose slots this transaction gives
    -- back or moves, in key order, before any trigger runs
    -- (soniq_key_lock_v1): the job's own (soniq_fail ends its run next, in
    -- the same transaction) and those of the queue's lapsed holds that keep a
    -- key's slot (deleted below; each deletion's trigger locks its key's row).
    SELECT pg_catalog.array_agg(w.queue), pg_catalog.array_agg(w.key) INTO v_queues, v_keys
      FROM (SELECT j.queue, j.concurrency_key AS key FROM {schema}.soniq_jobs AS j
             WHERE j.id = soniq_hold_slot.job_id::uuid AND j.concurrency_key IS NOT NULL
            UNION ALL
            SELECT k.queue, k.key FROM {schema}.soniq_queue_holds AS l
              JOIN {schema}.soniq_key_holds AS k
                ON k.job_id = l.job_id AND k.generation = l.generation
             WHERE l.queue = soniq_hold_slot.queue AND l.lease_expires_at <= v_now) AS w;
    IF v_keys IS NOT NULL THEN
        PERFORM {schema}.soniq_key_lock_v1(v_queues, v_keys);
    END IF;
    -- SKIP LOCKED: a lapsed hold another transaction is deleting is left to it.
    DELETE FROM {schema}.soniq_queue_holds AS h
     WHERE h.id IN (SELECT l.id FROM {schema}.soniq_queue_holds AS l
                     WHERE l.queue = soniq_hold_slot.queue AND l.lease_expires_at <= v_now
                       FOR UPDATE SKIP LOCKED);
    INSERT INTO {schema}.soniq_queue_holds AS h
           (job_id, generation, queue, claim_owner, lease_expires_at, created_at)
    VALUES (soniq_hold_slot.job_id::uuid, soniq_hold_slot.generation, soniq_hold_slot.queue,
            soniq_hold_slot.worker_id,
            v_now + pg_catalog.make_interval(secs => soniq_hold_slot.lease_seconds), v_now)
    ON CONFLICT ON CONSTRAINT soniq_queue_holds_claim_uniq
    DO UPDATE SET lease_expires_at = EXCLUDED.lease_expires_at;
    RETURN true;
END
$fn$;

-- soniq_key_sweep (version 13 body; same signature) --
CREATE OR REPLACE FUNCTION {schema}.soniq_key_sweep() RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_count integer;
    v_now timestamptz := pg_catalog.clock_timestamp();
    v_queues text[];
    v_keys text[];
BEGIN
    -- Version 13: the keys' rows first, in key order (soniq_key_lock_v1):
    -- each deleted hold's trigger locks its key's row, and in the order the
    -- holds are deleted two sweeps, or a sweep and a round, could each hold
    -- one the other waits for.
    SELECT pg_catalog.array_agg(k.queue), pg_catalog.array_agg(k.key) INTO v_queues, v_keys
      FROM {schema}.soniq_queue_holds AS q
      JOIN {schema}.soniq_key_holds AS k ON k.job_id = q.job_id AND k.generation = q.generation
     WHERE q.lease_expires_at <= v_now;
    IF v_keys IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM {schema}.soniq_key_lock_v1(v_queues, v_keys);
    DELETE FROM {schema}.soniq_queue_holds AS h
     WHERE h.id IN (SELECT q.id FROM {schema}.soniq_queue_holds AS q
                      JOIN {schema}.soniq_key_holds AS k
                        ON k.job_id = q.job_id AND k.generation = q.generation
                     WHERE q.lease_expires_at <= v_now
                       FOR UPDATE OF q SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_key_lock_v1(text[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_queue_budget_v3(text, integer) FROM PUBLIC;
