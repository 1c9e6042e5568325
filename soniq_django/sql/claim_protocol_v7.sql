-- soniq_django claim protocol, version 7 (PostgreSQL only): a batch is
-- written by one UPDATE.
--
-- Versions 1 to 6 stay as they are; this file gives soniq_claim_many and
-- soniq_complete_many new bodies with the same names, signatures, answers,
-- errors and grants. soniq_claim and soniq_complete are batches of one of
-- them, so they follow (and keep the per-row path, below). Loaded by
-- migration 0016_claim_protocol_v7; never edited once released. The reverse
-- (claim_protocol_v7.down.sql, then version 6's soniq_claim_many read back
-- from claim_protocol_v6.sql and version 2's soniq_complete_many from
-- claim_protocol_v2.sql) restores version 6's behaviour.
--
-- What a caller sees: nothing changes. What changes is what a batch costs
-- the server (docs/decisions/0026-set-based-batch-writes.md). Versions 2
-- and 6 wrote a batch of n jobs by n UPDATEs by primary key, each planned,
-- run and its index entry found on its own, and soniq_complete_many also
-- locked and read them one SELECT ... FOR UPDATE at a time. Version 7, for a
-- batch of more than one, locks the rows as before (claims: the same
-- FOR UPDATE SKIP LOCKED scans, which now also read each row's ctid;
-- completions: one SELECT ... FOR UPDATE of all the rows named, in id
-- order), reads clock_timestamp() after the last lock, and writes the batch
-- with one UPDATE ... FROM unnest(...) matched by the ctid of the rows it
-- locked. A row locked by this transaction cannot move before it ends, so
-- the ctid names the row that was locked and fence-checked. The fences are
-- version 1's, element by element: the whole fence compared byte for byte
-- (COLLATE "C") against the row as locked, status 'processing', a lease
-- strictly after the time read after the locks, no cancel requested; the
-- predicate repeated in the UPDATE; one answer per element, in input order.
-- A batch of one keeps the previous versions' path, which costs less there.

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
    v_free text[];
    v_queue text;
    v_budget integer;
    v_is_rated boolean;
    v_first_due timestamptz;
    v_any_due boolean;
    c_ids uuid[];
    c_tids tid[];
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
        -- write them (below): a batch of one by primary key, a larger one
        -- by one UPDATE matched by the ctid read here (version 7).
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
                SELECT j.id, j.ctid AS tid, j.claim_generation
                  FROM {schema}.soniq_jobs AS j
                 WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                   AND (p_queues IS NULL OR j.queue = ANY (p_queues))
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
                                   AND (p_queues IS NULL OR j.queue = ANY (p_queues))
                                 ORDER BY j.priority, j.created_at
                                 LIMIT v_wanted
                                   FOR UPDATE SKIP LOCKED) AS n
                        UNION ALL
                        SELECT d.id, d.tid, d.claim_generation, d.priority, d.created_at
                          FROM (SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority, j.created_at
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
                v_tids := v_tids || r.tid;
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
                SELECT n.id, n.tid, n.claim_generation, n.priority, n.created_at
                  FROM (SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority, j.created_at
                          FROM {schema}.soniq_jobs AS j
                         WHERE j.status = 'queued' AND j.scheduled_at IS NULL
                           AND j.queue = ANY (v_free)
                         ORDER BY j.priority, j.created_at
                         LIMIT v_wanted
                           FOR UPDATE SKIP LOCKED) AS n
                UNION ALL
                SELECT d.id, d.tid, d.claim_generation, d.priority, d.created_at
                  FROM (SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority, j.created_at
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
                c_tids := c_tids || r.tid;
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
                SELECT j.id, j.ctid AS tid, j.claim_generation, j.priority, j.created_at
                  FROM {schema}.soniq_jobs AS j
                 WHERE j.status = 'queued' AND j.queue = v_queue
                   AND (j.scheduled_at IS NULL
                        OR j.scheduled_at <= pg_catalog.clock_timestamp())
                 ORDER BY j.priority, j.created_at
                 LIMIT v_budget
                   FOR UPDATE SKIP LOCKED
            LOOP
                c_ids := c_ids || r.id;
                c_tids := c_tids || r.tid;
                c_generations := c_generations || r.claim_generation;
                c_priorities := c_priorities || r.priority;
                c_created := c_created || r.created_at;
            END LOOP;
        END LOOP;
        -- The first v_wanted candidates in claim order. The others stay
        -- locked (unchanged) until this transaction ends.
        SELECT pg_catalog.array_agg(c.id ORDER BY c.priority, c.created_at),
               pg_catalog.array_agg(c.tid ORDER BY c.priority, c.created_at),
               pg_catalog.array_agg(c.generation ORDER BY c.priority, c.created_at),
               pg_catalog.max(c.generation)
          INTO v_ids, v_tids, v_generations, v_top_generation
          FROM (SELECT u.id, u.tid, u.generation, u.priority, u.created_at
                  FROM ROWS FROM (pg_catalog.unnest(c_ids), pg_catalog.unnest(c_tids),
                                  pg_catalog.unnest(c_generations),
                                  pg_catalog.unnest(c_priorities), pg_catalog.unnest(c_created))
                       AS u(id, tid, generation, priority, created_at)
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
    RETURN v_done;
END
$fn$;