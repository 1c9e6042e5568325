-- soniq_django claim protocol, version 5 (PostgreSQL only): flow control per queue.
--
-- Versions 1 to 4 stay as they are; this file gives soniq_claim_many a new
-- body with the same name, signature, answers, errors and grants, and adds
-- one helper. soniq_claim is a batch of one of soniq_claim_many (version 3),
-- so it follows. Loaded by migration 0013_queue_flow_control, after the
-- tables soniq_queue_settings and soniq_queue_starts; never edited once
-- released. The reverse (claim_protocol_v5.down.sql, then version 2's body
-- read back from claim_protocol_v2.sql) restores version 4's behaviour.
--
-- What a caller sees: a claim may return fewer rows than it asked for, or
-- none, while jobs are queued and due -- those of a paused queue, and those
-- a queue's limits do not let start now. Nothing else changes.
--
-- 1. Paused queues. A claim skips every queued job of a queue whose
--    soniq_queue_settings row says paused. Jobs already running are not
--    touched: their fences, heartbeats and completions work as before.
-- 2. Concurrency. A queue with a limit of N (the row's concurrency, else its
--    configured_concurrency) never has more than N jobs in 'processing' from
--    claims: the claim locks the queue's row (FOR UPDATE), counts the
--    queue's processing jobs and starts at most the difference. Every claim
--    of the queue takes the same lock, so two claimers cannot both see the
--    last free slot. A processing row counts whatever its lease says, until
--    the reaper (which every claim runs first) settles it: a worker that
--    stopped heartbeating may still be running the handler.
-- 3. Rate. A queue with a rate of N per P seconds (rate_limit/rate_period,
--    else the configured pair) starts at most N jobs in any window of P
--    seconds: under the same lock the claim deletes the queue's
--    soniq_queue_starts rows older than P, counts the rest, starts at most
--    N minus that many, and records one row per job it starts, at the
--    claim's time. Every start of the queue holds the lock, so the window
--    is exact across workers.
--
-- Which limit applies is the row's own value, else the configured one,
-- field by field (the rate's two columns go together). A claim whose queues
-- have no row, or whose rows limit nothing, is version 2's claim after one
-- lookup of soniq_queue_settings, and takes no lock. Otherwise the queues it
-- may serve freely are named (a claim of every queue finds those with a
-- queued job by skipping through the claim index), so that a paused or
-- limited queue's backlog is never walked past. The counts need each statement to see what other claims
-- committed while this one waited for the lock: READ COMMITTED, the
-- default. A limited claim in another isolation level is refused (22023,
-- HINT CONFIG) rather than allowed to miscount.

-- soniq_queue_budget_v1 --
-- How many jobs of p_queue this claim may start, at most p_wanted: 0 when
-- the queue is paused, else what its concurrency and rate limits leave.
-- Locks the queue's soniq_queue_settings row until the end of the calling
-- transaction, reads the clock after the lock, and prunes the queue's
-- expired starts. rated: whether the queue has a rate limit (the caller
-- then records each start). A queue without a row: p_wanted, not rated.
CREATE FUNCTION {schema}.soniq_queue_budget_v1(
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
BEGIN
    IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'a claim of a queue with limits needs READ COMMITTED isolation'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    SELECT s.paused, coalesce(s.concurrency, s.configured_concurrency),
           CASE WHEN s.rate_limit IS NOT NULL THEN s.rate_limit ELSE s.configured_rate_limit END,
           CASE WHEN s.rate_limit IS NOT NULL THEN s.rate_period
                ELSE s.configured_rate_period END
      INTO v_paused, v_concurrency, v_rate, v_period
      FROM {schema}.soniq_queue_settings AS s
     WHERE s.queue = p_queue
       FOR UPDATE;
    budget := p_wanted;
    rated := false;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_paused THEN
        budget := 0;
        RETURN;
    END IF;
    IF v_concurrency IS NOT NULL THEN
        SELECT pg_catalog.count(*) INTO v_count
          FROM {schema}.soniq_jobs AS j
         WHERE j.status = 'processing' AND j.queue = p_queue;
        budget := LEAST(budget, v_concurrency - v_count);
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

-- soniq_claim_many --
-- Version 2's claim (claim_protocol_v2.sql says what it answers), with flow
-- control: the queues it may serve that are paused are skipped, and each
-- limited queue with a due job gets a budget (soniq_queue_budget_v1, taken in
-- queue-name order, so two claimers lock rows in one order). The jobs of the
-- free queues and at most each limited queue's budget of its jobs are locked
-- (SKIP LOCKED), then the first cardinality(claim_tokens) of them by
-- (priority, created_at) are claimed -- the order of version 2 among the
-- jobs that may start.
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

    IF v_paused IS NULL AND v_limited IS NULL THEN
        -- No flow control applies: version 2's claim as it was.
        -- Lock the jobs first (SKIP LOCKED: concurrent claimers take
        -- different rows), in claim order. Then write them one by one by
        -- primary key: for the usual batch of one, measured cheaper than one
        -- set-based UPDATE.
        FOR r IN
            SELECT j.id, j.claim_generation
              FROM {schema}.soniq_jobs AS j
             WHERE j.status = 'queued'
               AND (p_queues IS NULL OR j.queue = ANY (p_queues))
               AND (j.scheduled_at IS NULL OR j.scheduled_at <= pg_catalog.clock_timestamp())
             ORDER BY j.priority, j.created_at
             LIMIT v_wanted
               FOR UPDATE SKIP LOCKED
        LOOP
            v_ids := v_ids || r.id;
            v_generations := v_generations || r.claim_generation;
            v_top_generation := GREATEST(v_top_generation, r.claim_generation);
        END LOOP;
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
            FOR r IN
                SELECT j.id, j.claim_generation, j.priority, j.created_at
                  FROM {schema}.soniq_jobs AS j
                 WHERE j.status = 'queued'
                   AND j.queue = ANY (v_free)
                   AND (j.scheduled_at IS NULL
                        OR j.scheduled_at <= pg_catalog.clock_timestamp())
                 ORDER BY j.priority, j.created_at
                 LIMIT v_wanted
                   FOR UPDATE SKIP LOCKED
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

REVOKE ALL ON FUNCTION {schema}.soniq_queue_budget_v1(text, integer) FROM PUBLIC;
