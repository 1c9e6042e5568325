-- soniq_django claim protocol, version 2 (PostgreSQL only): batched claims.
--
-- Adds soniq_claim_many: one round trip and one commit claim up to
-- cardinality(claim_tokens) jobs, and every job still gets its own fence --
-- its own nonce (claim_tokens[i]) and its own generation, exactly as if it
-- had been claimed alone with soniq_claim. Everything else of version 1
-- (claim_protocol_v1.sql) stays as it is. Loaded by migration
-- 0009_claim_protocol_v2; never edited once released.

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
    v_wanted integer;
    v_ids uuid[];
    v_generations bigint[];
    v_worker uuid;
    v_now timestamptz;
    r record;
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(p_owner, 'worker_id');
    v_wanted := pg_catalog.cardinality(p_tokens);
    IF v_wanted IS NULL OR v_wanted < 1 OR v_wanted > 1000
       OR pg_catalog.array_ndims(p_tokens) <> 1 THEN
        RAISE EXCEPTION 'claim_tokens must hold 1 to 1000 nonces'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(p_tokens) AS t(token)
                WHERE t.token IS NULL OR t.token = '' OR pg_catalog.length(t.token) > 255) THEN
        RAISE EXCEPTION 'claim_token must be a non-empty string of at most 255 characters'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    PERFORM {schema}.soniq_check_seconds_v1(lease_seconds, 'lease_seconds', false);
    PERFORM {schema}.soniq_check_seconds_v1(result_ttl_seconds, 'result_ttl_seconds', true);
    IF soniq_claim_many.pid IS NOT NULL AND soniq_claim_many.pid < 1 THEN
        RAISE EXCEPTION 'pid must be a positive integer' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    -- A nonce may fence one claim only: twice in this call, or used before.
    IF (SELECT pg_catalog.count(DISTINCT t.token COLLATE "C")
          FROM pg_catalog.unnest(p_tokens) AS t(token)) <> v_wanted
       OR EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.claim_token = ANY (p_tokens)) THEN
        RAISE EXCEPTION 'claim token was used before' USING ERRCODE = 'P0001',
            HINT = 'QUEUE_CLAIM_CONFLICT', DETAIL = 'nonce_reused';
    END IF;

    PERFORM {schema}.soniq_reap_lapsed_v1(10, result_ttl_seconds);

    -- Lock the jobs first (SKIP LOCKED: concurrent claimers take different
    -- rows), in claim order; a locking query cannot aggregate, hence the
    -- subquery.
    SELECT pg_catalog.array_agg(s.id ORDER BY s.priority, s.created_at),
           pg_catalog.array_agg(s.claim_generation ORDER BY s.priority, s.created_at)
      INTO v_ids, v_generations
      FROM (SELECT j.id, j.claim_generation, j.priority, j.created_at
              FROM {schema}.soniq_jobs AS j
             WHERE j.status = 'queued'
               AND (p_queues IS NULL OR j.queue = ANY (p_queues))
               AND (j.scheduled_at IS NULL OR j.scheduled_at <= pg_catalog.clock_timestamp())
             ORDER BY j.priority, j.created_at
             LIMIT v_wanted
               FOR UPDATE SKIP LOCKED) AS s;
    IF v_ids IS NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_catalog.unnest(v_generations) AS g(generation)
                WHERE g.generation >= 9223372036854775807) THEN
        RAISE EXCEPTION 'claim generation is exhausted' USING ERRCODE = 'P0001',
            HINT = 'QUEUE_CLAIM_CONFLICT', DETAIL = 'generation_exhausted';
    END IF;

    -- worker_id names a soniq_workers row (Soniq declares a foreign key
    -- there): set only when the owner is a registered worker.
    SELECT w.id INTO v_worker FROM {schema}.soniq_workers AS w
     WHERE p_owner ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
       AND w.id = p_owner::uuid;

    v_now := pg_catalog.clock_timestamp();  -- after the locks
    PERFORM {schema}.soniq_fenced_write_v1(true);
    FOR r IN
        UPDATE {schema}.soniq_jobs AS j
           SET status = 'processing',
               attempts = j.attempts + 1,
               claim_generation = x.generation + 1,
               claim_owner = p_owner,
               claim_token = p_tokens[x.i],
               worker_id = v_worker,
               lease_expires_at = v_now + pg_catalog.make_interval(secs => lease_seconds),
               cancel_requested = false,
               pid = soniq_claim_many.pid,
               updated_at = v_now
          FROM pg_catalog.unnest(v_ids, v_generations) WITH ORDINALITY AS x(id, generation, i)
         WHERE j.id = x.id
        RETURNING j.claim_owner, j.claim_token, j.claim_generation, x.i, x.generation
    LOOP
        -- Owner, nonce and generation must be stored exactly as sent; a
        -- coercing column or a trigger that changed them voids the whole call.
        IF r.claim_owner IS NULL OR r.claim_owner COLLATE "C" <> p_owner COLLATE "C"
           OR r.claim_token IS NULL OR r.claim_token COLLATE "C" <> p_tokens[r.i] COLLATE "C"
           OR r.claim_generation IS DISTINCT FROM r.generation + 1 THEN
            RAISE EXCEPTION 'the stored claim identity differs from the one sent'
                USING ERRCODE = 'P0001', HINT = 'QUEUE_CLAIM_CONFLICT',
                      DETAIL = 'claim_identity_changed';
        END IF;
    END LOOP;
    PERFORM {schema}.soniq_fenced_write_v1(false);

    RETURN QUERY
        SELECT j.id, j.job_name, j.args, j.queue, j.priority, j.attempts, j.max_attempts,
               j.lease_expires_at, j.claim_generation, j.claim_owner::text, j.claim_token::text
          FROM pg_catalog.unnest(v_ids) WITH ORDINALITY AS x(id, i)
          JOIN {schema}.soniq_jobs AS j ON j.id = x.id
         ORDER BY x.i;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_claim_many(text, text[], text[], double precision, double precision, integer) FROM PUBLIC;
