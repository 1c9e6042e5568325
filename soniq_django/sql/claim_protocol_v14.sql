-- soniq_django claim protocol, version 14 (PostgreSQL only): under a pinned
-- horizon, the full probe for lapsed leases leaves the claim.
--
-- Versions 1 to 13 stay as they are; this file gives soniq_claim_many a new
-- body (same name, signature, answers, errors, grants and version 11's
-- settings enable_sort = off and jit = off) and adds soniq_settle_lapsed.
-- Loaded by migration 0034_claim_protocol_v14; never edited once released.
-- The reverse (claim_protocol_v14.down.sql, then version 13's
-- soniq_claim_many read back from claim_protocol_v13.sql, which carries its
-- settings) restores version 13. See
-- docs/decisions/0053-the-full-lapsed-probe-leaves-the-claim.md.
--
-- Why. Under a pinned horizon version 9's hints let a session's probe for
-- lapsed leases read only the leases that ended after its last probe, for
-- FULL_PROBE_EVERY (30 s); then one probe from the start of
-- soniq_jobs_lease_idx, which reads every dead entry the pin keeps. Those
-- probes were one of the two slow claims of each 30 s of a claiming session
-- (the other: the claim-order scan from the start, FULL_SCAN_EVERY), and
-- they grow with the pin's age: 15 ms four minutes into a 15-minute pin at
-- 300 jobs/s, 92 ms thirteen minutes in (bench/results/pin-15min-0305138).
--
-- What a probe from the start catches that a hinted probe cannot: a lease
-- that ended before the hint's bound (the last probe's clock less
-- LAPSED_MARGIN, 1 s) but was not visible then -- a late commit, a lease
-- written from a slow clock, one backdated by hand. A lease that lapses
-- after the bound is seen by the session's next claim, as before.
--
-- Version 14:
--
-- 1. The claim's probe from the start, once hinted, comes every
--    CLAIM_FULL_PROBE_EVERY (300 s) instead of every 30 s: a worker that
--    only claims (one in another language, say) still settles such a lease
--    within 300 s of its first claim after the lease commits, on every
--    session that claims. Without a pinned horizon nothing changes: the
--    probes never hint, and each reads from the start, as in version 8.
-- 2. soniq_settle_lapsed(result_ttl_seconds) settles up to SETTLE_BATCH
--    (100) lapsed leases, read from the start of soniq_jobs_lease_idx, with
--    the claim's reaper (soniq_reap_lapsed_v3, no lower bound): the full
--    probe, off the claim path. soniq_django's workers call it from their
--    housekeeping, once a minute, so with one of them running such a lease
--    is settled within about a minute. Granted with the worker's functions
--    (soniq_grant --worker).
--
-- Nothing else changes: the claim-order scan (claim_hint), the fences, the
-- reaper and the hint's format (scope|after|full probe at, in epoch
-- seconds) are version 13's, so a session that went through version 13
-- reads its hint as before (its next probe from the start is then at most
-- 30 s away, and the one after at most 300 s).

-- soniq_settle_lapsed: settle lapsed leases, read from the start --
-- Any lapsed lease (the reaper of the claims, without the hint's lower
-- bound), at most 100 per call, each in a sub-transaction of its own under
-- the reaper's 5 ms lock timeout: a row another transaction holds is left
-- for a later call or claim. Returns how many were settled.
CREATE FUNCTION {schema}.soniq_settle_lapsed(result_ttl_seconds double precision DEFAULT 300)
RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF result_ttl_seconds IS NULL OR result_ttl_seconds = 'NaN'::float8
       OR result_ttl_seconds < 0 OR result_ttl_seconds > 31536000 THEN
        RAISE EXCEPTION 'result_ttl_seconds is out of range'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    RETURN {schema}.soniq_reap_lapsed_v3(100, result_ttl_seconds, NULL);  -- SETTLE_BATCH
END
$fn$;

-- soniq_claim_many (version 14 body; same signature, settings of version 11) --
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
    -- found none, less LAPSED_MARGIN, for FULL_PROBE_EVERY. Version 14: for
    -- CLAIM_FULL_PROBE_EVERY (300 s); see the header of claim_protocol_v14.sql.
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
        -- Version 14: the next probe from the start CLAIM_FULL_PROBE_EVERY (300 s)
        -- later, not 30 s: the workers' housekeeping makes the frequent ones
        -- (soniq_settle_lapsed).
        IF v_lapsed_suspect THEN
            PERFORM pg_catalog.set_config('soniq.lapsed_hint', v_table || '|'
                || pg_catalog.date_part('epoch', v_clock - interval '1 second') || '|'
                || pg_catalog.date_part('epoch', v_clock + interval '300 seconds'), false);
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

REVOKE ALL ON FUNCTION {schema}.soniq_settle_lapsed(double precision) FROM PUBLIC;
