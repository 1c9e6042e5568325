-- soniq_django claim protocol, version 2 (PostgreSQL only): batched claims.
--
-- 1. Adds soniq_claim_many: one round trip and one commit claim up to
--    cardinality(claim_tokens) jobs, and every job still gets its own
--    fence -- its own nonce (claim_tokens[i]) and its own generation,
--    exactly as if it had been claimed alone with soniq_claim.
-- 2. Adds soniq_complete_many: several completions in one call, each checked
--    against its own whole fence exactly as soniq_complete checks one. With
--    soniq_claim_many in the same transaction, a worker settles every job
--    that finished and refills every free slot in one round trip.
-- 3. Gives soniq_complete a body with the same signature, rules, answers
--    and error codes that is a batch of one of soniq_complete_many, whose
--    checks are written out in place (version 1 made them through helper
--    functions, each with its own SET search_path, which PostgreSQL saves
--    and restores on every call, and never inlines).
--
-- The rest of version 1 (claim_protocol_v1.sql) stays as it is. Loaded by
-- migration 0009_claim_protocol_v2; never edited once released. The fencing
-- rules are version 1's: lock the row, THEN read clock_timestamp(), compare
-- the whole fence byte for byte (COLLATE "C"), require status 'processing'
-- and a lease strictly after that time, and repeat the predicate in the
-- UPDATE. Writes open the soniq_protect_owned gate (the transaction-local
-- setting soniq.fenced_write) only around themselves.

-- soniq_claim_many --
-- Claim up to cardinality(claim_tokens) eligible jobs for worker_id, in the
-- order soniq_claim would take them one by one ((priority, created_at) among
-- queued, due jobs in `queues`; NULL: any queue). The i-th job claimed gets
-- the nonce claim_tokens[i]; rows come back in claim order, fewer (or none)
-- when fewer are eligible. Nonces unused by this call stay unused and may be
-- sent again. Tokens must be distinct, at most 1000 of them; a token used
-- before (here or by soniq_claim) fails the whole call with nonce_reused.
-- Like soniq_claim, it first settles up to ten lapsed leases.
CREATE FUNCTION {schema}.soniq_claim_many(
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

    -- Lock the jobs first (SKIP LOCKED: concurrent claimers take different
    -- rows), in claim order. Then write them one by one by primary key: for
    -- the usual batch of one, measured cheaper than one set-based UPDATE.
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
        job_id := r.id; job_name := r.job_name; args := r.args; queue := r.queue;
        priority := r.priority; attempts := r.attempts; max_attempts := r.max_attempts;
        lease_expires_at := r.lease_expires_at; generation := r.claim_generation;
        owner := r.claim_owner; token := r.claim_token;
        RETURN NEXT;
    END LOOP;
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
END
$fn$;

-- soniq_complete_many --
-- Complete several live claims, the i-th with results[i] (any JSON, or NULL),
-- each exactly as soniq_complete(job_ids[i], worker_id, generations[i],
-- claim_tokens[i], queues[i], results[i], result_ttl_seconds) would. Returns
-- one boolean per job, in the order given: true where that completion was
-- applied, false where the fence no longer owns the job (or a cancel is
-- requested). The arrays must have the same length, 1 to 1000; rows are
-- locked in job id order so that two callers cannot deadlock on each other.
CREATE FUNCTION {schema}.soniq_complete_many(
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
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
    RETURN v_done;
END
$fn$;

-- soniq_complete (version 2 body; same signature and answers as version 1) --
-- Finish the exact live claim with result (any JSON, or NULL): status done,
-- lease and pid cleared, row kept for result_ttl_seconds. Refused (false)
-- while a cancel is requested, and when already completed. One completion
-- is a batch of one: soniq_complete_many holds the only copy of the rules.
CREATE OR REPLACE FUNCTION {schema}.soniq_complete(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    result jsonb DEFAULT NULL, result_ttl_seconds double precision DEFAULT 300
) RETURNS boolean
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT ({schema}.soniq_complete_many(
        ARRAY[job_id], worker_id, ARRAY[generation], ARRAY[claim_token], ARRAY[queue],
        ARRAY[result], result_ttl_seconds))[1]
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_claim_many(text, text[], text[], double precision, double precision, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_complete_many(text[], text, bigint[], text[], text[], jsonb[], double precision) FROM PUBLIC;
