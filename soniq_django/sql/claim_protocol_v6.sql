-- soniq_django claim protocol, version 6 (PostgreSQL only): a claim does not
-- read the jobs scheduled for later.
--
-- Versions 1 to 5 stay as they are; this file gives soniq_claim_many a new
-- body with the same name, signature, answers, errors and grants.
-- soniq_claim is a batch of one of soniq_claim_many (version 3), so it
-- follows. Loaded by migration 0014_claim_scheduled_indexes, which first
-- replaces the index soniq_jobs_claim_any_idx (priority, created_at of the
-- queued jobs) by three on the queued jobs: soniq_jobs_claim_now_idx
-- (priority, created_at of those not scheduled), soniq_jobs_claim_scheduled_idx
-- (priority, created_at of those scheduled) and soniq_jobs_claim_due_idx
-- (scheduled_at of those scheduled). Never edited once released. The
-- reverse (claim_protocol_v6.down.sql, then version 5's body read back from
-- claim_protocol_v5.sql) restores version 5's behaviour and index.
--
-- What a caller sees: nothing changes. A claim takes the first queued, due
-- jobs by (priority, created_at), as before; what changes is what finding
-- them costs. Version 5 scanned the queued jobs in claim order and filtered
-- out those not yet due, so every job scheduled for later and enqueued
-- before the next due one was read again by every claim: with 100,000 jobs
-- scheduled a day ahead mixed into 10,000 ready ones, a claim read tens of
-- thousands of rows (bench/scale.py, docs/performance.md "Scale"; decision
-- 0018). Version 6 first reads the one scheduled job that falls due first;
-- if it is not due yet, the claim takes unscheduled jobs only, from an index
-- that holds no scheduled job. If it is due, the claim also takes the first
-- due scheduled jobs in claim order, from an index of the scheduled jobs
-- alone, and claims the first of both: that scan reads past the scheduled
-- jobs not yet due that come before them, never past an unscheduled one.
-- Every scan is in the order of its index with a LIMIT, and no condition on
-- the clock is an index condition, so the plan does not depend on how many
-- rows the planner guesses are due.
--
-- Under flow control (version 5's second path) the queues served freely
-- are claimed the same way; the candidates of each limited queue are still
-- found by one scan of that queue in claim order (soniq_jobs_claim_idx),
-- which reads past that queue's jobs scheduled for later.

-- soniq_claim_many --
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
    v_generations bigint[];
    v_worker uuid;
    v_now timestamptz;
    v_token text;
    v_i integer;
    v_top_generation bigint;
    v_paused text[];
    v_limited text[];
    v_rated text[];
    v_skip text[];
    v_free text[];
    v_queue text;
    v_budget integer;
    v_is_rated boolean;
    v_first_due timestamptz;
    v_any_due boolean;
    c_ids uuid[];
    c_generations bigint[];
    c_priorities integer[];
    c_created timestamptz[];
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
    -- lapsed) to one index lookup.
    IF EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j
                WHERE j.status = 'processing'
                  AND j.lease_expires_at <= pg_catalog.clock_timestamp()) THEN
        PERFORM {schema}.soniq_reap_lapsed_v1(10, p_ttl);
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

    IF v_paused IS NULL AND v_limited IS NULL THEN
        -- No flow control applies. Lock the jobs first (SKIP LOCKED:
        -- concurrent claimers take different rows), in claim order. Then
        -- write them one by one by primary key: for the usual batch of one,
        -- measured cheaper than one set-based UPDATE.
        -- Version 6: while no scheduled job is due (the usual case), the
        -- candidates are the first unscheduled jobs in claim order, from
        -- soniq_jobs_claim_now_idx, which holds no scheduled job. When one
        -- is due, also the first due scheduled jobs in claim order, from
        -- soniq_jobs_claim_scheduled_idx, and the first v_wanted of both
        -- are claimed; the candidates not taken stay locked (unchanged)
        -- until this transaction ends. Two statements, of which each claim
        -- plans and runs one: the usual one costs no more than version 5's.
        IF NOT v_any_due THEN
            FOR r IN
                SELECT j.id, j.claim_generation
                  FROM {schema}.soniq_jobs AS j
                 WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                   AND (p_queues IS NULL OR j.queue = ANY (p_queues))
                 ORDER BY j.priority, j.created_at
                 LIMIT v_wanted
                   FOR UPDATE SKIP LOCKED
            LOOP
                v_ids := v_ids || r.id;
                v_generations := v_generations || r.claim_generation;
                v_top_generation := GREATEST(v_top_generation, r.claim_generation);
            END LOOP;
        ELSE
            FOR r IN
                SELECT c.id, c.claim_generation
                  FROM (SELECT n.id, n.claim_generation, n.priority, n.created_at
                          FROM (SELECT j.id, j.claim_generation, j.priority, j.created_at
                                  FROM {schema}.soniq_jobs AS j
                                 WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                                   AND (p_queues IS NULL OR j.queue = ANY (p_queues))
                                 ORDER BY j.priority, j.created_at
                                 LIMIT v_wanted
                                   FOR UPDATE SKIP LOCKED) AS n
                        UNION ALL
                        SELECT d.id, d.claim_generation, d.priority, d.created_at
                          FROM (SELECT j.id, j.claim_generation, j.priority, j.created_at
                                  FROM {schema}.soniq_jobs AS j
                                 WHERE j.status = 'queued' AND j.scheduled_at IS NOT NULL
                                   AND j.scheduled_at <= pg_catalog.clock_timestamp()
                                   AND (p_queues IS NULL OR j.queue = ANY (p_queues))
                                 ORDER BY j.priority, j.created_at
                                 LIMIT v_wanted
                                   FOR UPDATE SKIP LOCKED) AS d) AS c
                 ORDER BY c.priority, c.created_at
                 LIMIT v_wanted
            LOOP
                v_ids := v_ids || r.id;
                v_generations := v_generations || r.claim_generation;
                v_top_generation := GREATEST(v_top_generation, r.claim_generation);
            END LOOP;
        END IF;
    ELSE
        v_skip := coalesce(v_paused, '{}'::text[]) || coalesce(v_limited, '{}'::text[]);
        -- The queues served that nothing holds back: named by the caller, or
        -- (all queues) those with a queued job, found by skipping through
        -- the claim index one queue at a time. A filter on the skipped
        -- queues instead would walk past every one of their queued jobs.
        IF p_queues IS NOT NULL THEN
            v_free := ARRAY(SELECT q.name FROM pg_catalog.unnest(p_queues) AS q(name)
                             WHERE q.name <> ALL (v_skip));
        ELSE
            v_free := ARRAY(
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
        IF pg_catalog.cardinality(v_free) > 0 THEN
            -- Version 6: from the two claim-order indexes, as above.
            FOR r IN
                SELECT n.id, n.claim_generation, n.priority, n.created_at
                  FROM (SELECT j.id, j.claim_generation, j.priority, j.created_at
                          FROM {schema}.soniq_jobs AS j
                         WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                           AND j.queue = ANY (v_free)
                         ORDER BY j.priority, j.created_at
                         LIMIT v_wanted
                           FOR UPDATE SKIP LOCKED) AS n
                UNION ALL
                SELECT d.id, d.claim_generation, d.priority, d.created_at
                  FROM (SELECT j.id, j.claim_generation, j.priority, j.created_at
                          FROM {schema}.soniq_jobs AS j
                         WHERE v_any_due
                           AND j.status = 'queued' AND j.scheduled_at IS NOT NULL
                           AND j.scheduled_at <= pg_catalog.clock_timestamp()
                           AND j.queue = ANY (v_free)
                         ORDER BY j.priority, j.created_at
                         LIMIT v_wanted
                           FOR UPDATE SKIP LOCKED) AS d
            LOOP
                c_ids := c_ids || r.id;
                c_generations := c_generations || r.claim_generation;
                c_priorities := c_priorities || r.priority;
                c_created := c_created || r.created_at;
            END LOOP;
        END IF;
        FOREACH v_queue IN ARRAY coalesce(v_limited, '{}'::text[]) LOOP
            -- An empty queue takes no lock.
            CONTINUE WHEN NOT EXISTS (
                SELECT 1 FROM {schema}.soniq_jobs AS j
                 WHERE j.status = 'queued' AND j.queue = v_queue
                   AND (j.scheduled_at IS NULL
                        OR j.scheduled_at <= pg_catalog.clock_timestamp()));
            SELECT b.budget, b.rated INTO v_budget, v_is_rated
              FROM {schema}.soniq_queue_budget_v1(v_queue, v_wanted) AS b;
            IF v_is_rated THEN
                v_rated := v_rated || v_queue;
            END IF;
            CONTINUE WHEN v_budget < 1;
            FOR r IN
                SELECT j.id, j.claim_generation, j.priority, j.created_at
                  FROM {schema}.soniq_jobs AS j
                 WHERE j.status = 'queued' AND j.queue = v_queue
                   AND (j.scheduled_at IS NULL
                        OR j.scheduled_at <= pg_catalog.clock_timestamp())
                 ORDER BY j.priority, j.created_at
                 LIMIT v_budget
                   FOR UPDATE SKIP LOCKED
            LOOP
                c_ids := c_ids || r.id;
                c_generations := c_generations || r.claim_generation;
                c_priorities := c_priorities || r.priority;
                c_created := c_created || r.created_at;
            END LOOP;
        END LOOP;
        -- The first v_wanted candidates in claim order. The others stay
        -- locked (unchanged) until this transaction ends.
        SELECT pg_catalog.array_agg(c.id ORDER BY c.priority, c.created_at),
               pg_catalog.array_agg(c.generation ORDER BY c.priority, c.created_at),
               pg_catalog.max(c.generation)
          INTO v_ids, v_generations, v_top_generation
          FROM (SELECT u.id, u.generation, u.priority, u.created_at
                  FROM ROWS FROM (pg_catalog.unnest(c_ids), pg_catalog.unnest(c_generations),
                                  pg_catalog.unnest(c_priorities), pg_catalog.unnest(c_created))
                       AS u(id, generation, priority, created_at)
                 ORDER BY u.priority, u.created_at
                 LIMIT v_wanted) AS c;
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
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
END
$fn$;
