-- soniq_django claim protocol, version 8 (PostgreSQL only): bounded waits.
--
-- Versions 1 to 7 stay as they are; this file gives functions new bodies
-- (same names, signatures and grants unless a block says otherwise) and adds
-- the functions of slots held by timed-out handlers (soniq_queue_holds).
-- Loaded by migration 0018_claim_protocol_v8; never edited once released. The
-- reverse (claim_protocol_v8.down.sql, then the released bodies the migration
-- names) restores version 7's behaviour.
--
-- See docs/decisions/0029-claim-protocol-v8.md.
--
-- The claim's part (the blocks from here to the REVOKEs after
-- soniq_complete_many):
--
-- 1. A claim never waits for a queue's soniq_queue_settings row. Versions 5
--    to 7 locked a limited queue's row with FOR UPDATE, so an operator's
--    open transaction on it (or another claim of that queue) made the claim
--    wait without bound, holding FOR UPDATE locks on the free queues'
--    candidates it had already taken. Version 8 takes the row with
--    FOR UPDATE SKIP LOCKED (soniq_queue_budget_v2): a row locked by anyone
--    else holds that queue back for this claim (budget 0), as if it had no
--    free slot; the other queues are claimed as usual. The budgets are known
--    before any job is locked, and the jobs of the queues served freely are
--    locked after them. A queue's running jobs are its processing rows plus
--    its live soniq_queue_holds rows (slots kept by handlers that ran past
--    their time limit).
-- 2. The reaper inside the claim never waits for a producer
--    (soniq_reap_lapsed_v2): putting a lapsed unique or dedup job back in
--    the queue waits, on the unique index, for a producer whose uncommitted
--    twin holds the same key. Each row is now settled under a lock_timeout
--    of 5 ms; a row that would wait longer is left for a later claim.
-- 3. A claim's cost does not grow with backlogs it does not serve. Version 7
--    scanned the claim-order index of every queue and filtered the queue,
--    so a paused queue's backlog (or a limited queue's whose budget is 0, or
--    any queue's a worker does not name) was read again by every claim:
--    100,000 rows removed by the filter, 15 ms instead of 0.4. Version 8
--    scans each served queue on its own (soniq_jobs_claim_queue_now_idx,
--    (queue, priority, created_at) of the unscheduled queued jobs; while a
--    scheduled job is due, soniq_jobs_claim_idx) and merges them in claim
--    order. A claim of every queue with no flow control (the usual worker)
--    keeps version 7's plan.
-- 4. soniq_complete_many (and soniq_complete, a batch of one of it) closes
--    the write gate (soniq.fenced_write) before it returns, as version 2
--    did; version 7 left it open for the rest of the caller's transaction.
--
-- What a caller sees: nothing new but fewer rows, or none, while a limited
-- queue's settings row is locked -- the same answer as a queue without a
-- free slot. Fences, answers, errors and grants are version 7's.

-- soniq_queue_budget_v2 --
-- How many jobs of p_queue this claim may start, at most p_wanted: 0 when
-- the queue is paused or its soniq_queue_settings row is locked, else what
-- its concurrency and rate limits leave. Version 1 waited for the row lock
-- (FOR UPDATE) without bound; version 2 takes it with SKIP LOCKED and never
-- waits: a row someone else holds (another claim of the queue, until it
-- commits, or an operator's open transaction) holds the queue back for this
-- claim. Only the holder of the lock counts and starts, so two claimers still
-- cannot both take the last slot. Running jobs: the queue's processing rows
-- plus its soniq_queue_holds rows whose lease is after the time read after
-- the lock; the lapsed holds of the queue are deleted (SKIP LOCKED: a hold
-- its worker is writing right now is left for the next claim). The rest is
-- version 1's: the clock read after the lock, the queue's expired starts
-- pruned, rated says whether the caller records each start. A queue without
-- a row: p_wanted, not rated.
CREATE FUNCTION {schema}.soniq_queue_budget_v2(
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

-- soniq_reap_lapsed_v2 --
-- Version 1's reaper (claim_protocol_v3.sql), which never waits for a
-- producer. Settle up to `batch` owned claims whose lease has lapsed, each on
-- its own: a cancel-requested one becomes cancelled; one whose attempts
-- reached its limit moves to the dead letters (max_retries_exceeded); any
-- other is queued again, or superseded by a queued twin (soniq_requeue_v1).
-- Rows another transaction holds are skipped (SKIP LOCKED). Putting a unique
-- or dedup job back in the queue inserts its key into a unique index, where
-- a producer's uncommitted twin with the same key makes it wait until that
-- producer ends: the function runs with lock_timeout 5 ms (its own SET, put
-- back on return), and a row whose settling hits it is left as it is for a
-- later claim, without a warning. Bound: batch x 5 ms (50 ms for the
-- claim's 10). A row that cannot be settled for another reason is skipped
-- with a WARNING, as before. Returns how many were settled.
CREATE FUNCTION {schema}.soniq_reap_lapsed_v2(batch integer, result_ttl_seconds double precision)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '5ms'
AS $fn$
#variable_conflict use_column
DECLARE
    r record;
    v_now timestamptz;
    v_count integer := 0;
    v_seen boolean := false;
BEGIN
    FOR r IN
        SELECT j.id, j.job_name, j.attempts, j.max_attempts, j.cancel_requested
          FROM {schema}.soniq_jobs AS j
         WHERE j.status = 'processing' AND j.lease_expires_at <= pg_catalog.clock_timestamp()
         ORDER BY j.lease_expires_at
         LIMIT batch
           FOR UPDATE SKIP LOCKED
    LOOP
        v_seen := true;
        v_now := pg_catalog.clock_timestamp();
        BEGIN
            PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
            IF r.cancel_requested THEN
                UPDATE {schema}.soniq_jobs AS j
                   SET status = 'cancelled', lease_expires_at = NULL, pid = NULL,
                       expires_at = v_now + pg_catalog.make_interval(secs => result_ttl_seconds),
                       updated_at = v_now
                 WHERE j.id = r.id;
            ELSIF r.attempts >= coalesce(r.max_attempts,
                                         {schema}.soniq_default_max_attempts_v1(r.job_name)) THEN
                PERFORM {schema}.soniq_move_to_dead_letter_v1(
                    r.id, 'lease lapsed with no attempts left', 'max_retries_exceeded', NULL);
            ELSE
                PERFORM {schema}.soniq_requeue_v1(
                    r.id, 'lease lapsed: the worker stopped heartbeating', NULL, v_now,
                    result_ttl_seconds);
            END IF;
            v_count := v_count + 1;
        EXCEPTION
            WHEN lock_not_available THEN
                -- Waited 5 ms (a producer's open transaction holds the key):
                -- the sub-block's writes are undone, the row stays lapsed
                -- and a later claim settles it.
                NULL;
            WHEN OTHERS THEN
                -- The sub-block's writes are undone; the claim goes on.
                RAISE WARNING 'soniq: lapsed job % could not be settled (SQLSTATE %); left for later',
                    r.id, SQLSTATE;
        END;
    END LOOP;
    IF v_seen THEN  -- in the common case nothing lapsed and nothing was opened
        PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
    END IF;
    RETURN v_count;
END
$fn$;

-- soniq_claim_many --
-- Version 7's claim (claim_protocol_v7.sql; version 2's answers), that never
-- waits for a queue's settings row and whose cost does not grow with the
-- backlogs of queues it does not serve. With no flow control and no queue
-- named (the usual worker), version 7's statements (less their filter on
-- the queues named, which is NULL there). Otherwise
-- the queues served are scanned one by one, each from an index that starts
-- with the queue, and merged in claim order (priority, created_at, then the
-- row's place in the table, the order a scan of soniq_jobs_claim_now_idx
-- gives rows that tie): no scan reads a row of a queue it does not serve. Under
-- flow control, each limited queue with a due job first gets its budget
-- (soniq_queue_budget_v2, in queue-name order; never waits), and only then
-- are jobs locked: those of the free queues and at most each limited queue's
-- budget of its own (SKIP LOCKED), and the first cardinality(claim_tokens) of
-- them in claim order are claimed. The others stay locked (unchanged) until
-- this transaction ends.
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
    s_queues text[];
    s_limits integer[];
    r record;
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
    -- for a producer (at most 5 ms a row).
    IF EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j
                WHERE j.status = 'processing'
                  AND j.lease_expires_at <= pg_catalog.clock_timestamp()) THEN
        PERFORM {schema}.soniq_reap_lapsed_v2(10, p_ttl);
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
            FOR r IN
                SELECT j.id, j.ctid AS tid, j.claim_generation
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
            END LOOP;
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
                  FROM {schema}.soniq_queue_budget_v2(v_queue, v_wanted) AS b;
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
                FOR r IN
                    SELECT j.id, j.ctid AS tid, j.claim_generation
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
                END LOOP;
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
                   updated_at = v_now
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
                       updated_at = v_now
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

-- soniq_complete_many --
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
               AND j.claim_token = p_tokens[v_i]
               AND j.claim_generation = p_generations[v_i]
               AND j.status = 'processing' AND j.lease_expires_at > v_now
               AND NOT j.cancel_requested;
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
               pg_catalog.array_agg(k.cancel_requested)
          INTO l_tids, l_ids, l_queues, l_owners, l_generations, l_tokens, l_statuses,
               l_leases, l_cancels
          FROM (SELECT j.ctid AS tid, j.id, j.queue, j.claim_owner, j.claim_generation,
                       j.claim_token, j.status, j.lease_expires_at, j.cancel_requested
                  FROM {schema}.soniq_jobs AS j
                 WHERE j.id = ANY (v_ids)
                 ORDER BY j.id
                   FOR UPDATE) AS k;
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
REVOKE ALL ON FUNCTION {schema}.soniq_queue_budget_v2(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_reap_lapsed_v2(integer, double precision) FROM PUBLIC;

SELECT 1;

-- Slots held by handlers that run on (helper `holds`, docs/decisions/0033) ----
--
-- A concurrency limit is about the service behind the queue: it counts
-- handlers running, not rows. A plain function past its time limit cannot be
-- stopped; its claim ends at the deadline (soniq_fail) but the function runs
-- on. The worker calls soniq_hold_slot in the transaction of that soniq_fail,
-- before it, so the slot passes from the processing row to a row of
-- soniq_queue_holds without a gap; soniq_renew_holds keeps the holds of the
-- handlers still running alive (each beat), and soniq_release_hold deletes a
-- hold once its handler returned. A worker that dies stops renewing: its
-- holds lapse with their lease, as its claims do. A claim counts a queue's
-- running jobs as its processing rows plus its live holds
-- (lease_expires_at after the claim's time).

-- soniq_hold_slot --
-- Keep the queue slot of the exact live claim for its handler, which runs on
-- after the claim ends: one hold row (job_id, generation, queue, worker_id),
-- its lease ending lease_seconds from now. Call it in the transaction that
-- ends the claim (soniq_fail of a timeout), before that write: it locks the
-- row and checks the whole fence after the lock, as every fenced write does.
-- True when held (again: its lease renewed); false, nothing written, when
-- the fence does not own the job (missing, stale, expired, finished). Also
-- deletes the queue's lapsed holds (their workers stopped renewing them):
-- the claim's budget does so for a limited queue, this for every queue.
CREATE FUNCTION {schema}.soniq_hold_slot(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    lease_seconds double precision DEFAULT 30
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM {schema}.soniq_check_seconds_v1(lease_seconds, 'lease_seconds', false);
    -- Locks the row, then reads the clock: the whole fence is compared after the lock.
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_hold_slot.job_id, soniq_hold_slot.worker_id, soniq_hold_slot.generation,
        soniq_hold_slot.claim_token, soniq_hold_slot.queue);
    IF v_now IS NULL THEN
        RETURN false;
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

-- soniq_release_hold --
-- The handler of a held slot returned: delete the hold of that claim (job_id
-- and generation) made by worker_id. True when a hold was deleted; false when
-- there was none (never taken, released before, or another worker's).
-- Touches no job row: the claim ended when the hold was taken.
CREATE FUNCTION {schema}.soniq_release_hold(
    job_id text, worker_id text, generation bigint
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(soniq_release_hold.worker_id, 'worker_id');
    IF soniq_release_hold.job_id IS NULL OR soniq_release_hold.generation IS NULL
       OR soniq_release_hold.generation < 1 THEN
        RAISE EXCEPTION 'invalid hold' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    DELETE FROM {schema}.soniq_queue_holds AS h
     WHERE h.job_id = soniq_release_hold.job_id::uuid
       AND h.generation = soniq_release_hold.generation
       AND h.claim_owner COLLATE "C" = soniq_release_hold.worker_id COLLATE "C";
    RETURN FOUND;
END
$fn$;

-- soniq_renew_holds --
-- Renew worker_id's live holds of the claims named (job_ids[i] with
-- generations[i]; 1 to 1000 of them): each lease ends lease_seconds from now.
-- A lapsed hold is not renewed (its slot may have been taken since). Returns
-- how many were renewed. Named one by one rather than every hold of the
-- worker, so that a hold whose release failed is never kept alive: it lapses.
CREATE FUNCTION {schema}.soniq_renew_holds(
    worker_id text, job_ids text[], generations bigint[],
    lease_seconds double precision DEFAULT 30
) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_count integer;
    v_size integer := pg_catalog.cardinality(soniq_renew_holds.job_ids);
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(soniq_renew_holds.worker_id, 'worker_id');
    PERFORM {schema}.soniq_check_seconds_v1(lease_seconds, 'lease_seconds', false);
    IF v_size IS NULL OR v_size < 1 OR v_size > 1000
       OR pg_catalog.array_ndims(soniq_renew_holds.job_ids) <> 1
       OR pg_catalog.cardinality(soniq_renew_holds.generations) IS DISTINCT FROM v_size
       OR pg_catalog.array_ndims(soniq_renew_holds.generations) <> 1 THEN
        RAISE EXCEPTION 'job_ids and generations must hold 1 to 1000 claims each, in pairs'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    v_now := pg_catalog.clock_timestamp();
    UPDATE {schema}.soniq_queue_holds AS h
       SET lease_expires_at = v_now + pg_catalog.make_interval(
               secs => soniq_renew_holds.lease_seconds)
      FROM ROWS FROM (pg_catalog.unnest(soniq_renew_holds.job_ids),
                      pg_catalog.unnest(soniq_renew_holds.generations)) AS c(job_id, generation)
     WHERE h.job_id = c.job_id::uuid AND h.generation = c.generation
       AND h.claim_owner COLLATE "C" = soniq_renew_holds.worker_id COLLATE "C"
       AND h.lease_expires_at > v_now;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- soniq_defer (version 8 body; same signature) --
-- Version 4's deferral (claim_protocol_v4.sql says what it answers), and a
-- deferral is not a start: the start this claim recorded in
-- soniq_queue_starts (a rate-limited queue's window) is taken back in the
-- same transaction. The claim wrote its time both there (started_at) and in
-- the row (updated_at); a renewal of the lease moves updated_at, and then
-- the start is left to age out of the window as before. One row is deleted
-- (a batch claim's starts share a time); SKIP LOCKED lets two deferrals of
-- one batch take back one start each instead of waiting for each other.
CREATE OR REPLACE FUNCTION {schema}.soniq_defer(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    error text,
    delay_seconds double precision DEFAULT 0,
    result_ttl_seconds double precision DEFAULT 300
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    r record;
BEGIN
    IF soniq_defer.error IS NULL THEN
        RAISE EXCEPTION 'invalid deferral' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    PERFORM {schema}.soniq_check_seconds_v1(delay_seconds, 'delay_seconds', true);
    PERFORM {schema}.soniq_check_seconds_v1(result_ttl_seconds, 'result_ttl_seconds', true);
    -- Locks the row, then reads the clock: the whole fence is compared after the lock.
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_defer.job_id, soniq_defer.worker_id, soniq_defer.generation,
        soniq_defer.claim_token, soniq_defer.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    SELECT j.cancel_requested, j.queue, j.updated_at INTO r
      FROM {schema}.soniq_jobs AS j WHERE j.id = soniq_defer.job_id::uuid;
    IF r.cancel_requested THEN  -- the worker must acknowledge the cancel instead
        RETURN false;
    END IF;
    DELETE FROM {schema}.soniq_queue_starts AS t
     WHERE t.ctid = (SELECT s.ctid FROM {schema}.soniq_queue_starts AS s
                      WHERE s.queue = r.queue AND s.started_at = r.updated_at
                      LIMIT 1
                        FOR UPDATE SKIP LOCKED);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    UPDATE {schema}.soniq_jobs AS j
       SET attempts = GREATEST(j.attempts - 1, 0)
     WHERE j.id = soniq_defer.job_id::uuid;
    PERFORM {schema}.soniq_requeue_v1(
        soniq_defer.job_id::uuid, soniq_defer.error,
        v_now + pg_catalog.make_interval(secs => soniq_defer.delay_seconds),
        v_now, soniq_defer.result_ttl_seconds);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
    RETURN true;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_hold_slot(text, text, bigint, text, text, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_release_hold(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_renew_holds(text, text[], bigint[], double precision) FROM PUBLIC;
