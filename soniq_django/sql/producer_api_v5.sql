-- soniq_django producer API, version 5 (PostgreSQL only): jobs that wait for
-- other jobs.
--
-- Loaded by migration 0025_workflows after workflows_v1.sql (the tables'
-- triggers), with {schema} replaced by the quoted schema that holds the soniq
-- tables; producer_api_v5.down.sql drops what it adds. Never edited once
-- released. soniq_enqueue and soniq_enqueue_many are not changed: their
-- signature is the storage-format seed's, and a new parameter (even with a
-- default) would make every existing call ambiguous or need a DROP that
-- takes the grants with it. So the dependencies have a function of their own.
--
-- soniq_enqueue_after(depends_on uuid[], <soniq_enqueue's parameters>,
--                     any_outcome boolean DEFAULT false,
--                     result_ttl_seconds float8 DEFAULT 300) -> uuid
--
-- Enqueues the job as soniq_enqueue does (same checks, codes, duplicate
-- rules: it calls soniq_enqueue), and makes it wait until every job named in
-- depends_on is done (any_outcome: until each has finished, whatever its
-- outcome -- a batch's callback). In one transaction:
--
-- 1. Each named job's row is locked (in id order, so two enqueues cannot
--    deadlock) and marked has_dependents = true while it is queued or
--    processing. The lock orders this enqueue against the write that ends
--    the dependency: that write either came first (its outcome is read
--    below, after the lock) or comes after this transaction, and then its
--    trigger (workflows_v1.sql) finds the edges written here. The mark is
--    what lets a plain job's completion skip the trigger (its WHEN clause).
-- 2. A name that is in neither job table is refused: SQLSTATE 22023, HINT
--    SONIQ_UNKNOWN_DEPENDENCY, nothing written. A dependency can only name a
--    job that exists before this one, so no cycle can be built.
-- 3. The job goes in through soniq_enqueue, scheduled at 9999-01-01 UTC while
--    something is left to wait for: no claim (soniq_claim_many's, Soniq
--    0.1/0.2's own UPDATE, any worker that honours scheduled_at) takes it,
--    and it is in neither soniq_jobs_claim_now_idx nor
--    soniq_jobs_claim_queue_now_idx. Its own run_at is kept in
--    soniq_job_waits and restored when the last dependency is done.
-- 4. One edge per dependency in soniq_job_dependencies, in state done,
--    failed or waiting; one soniq_job_waits row (pending = the waiting
--    edges) when some wait.
-- 5. A dependency already cancelled or dead-lettered (unless any_outcome)
--    ends the new job at once: cancelled, last_error
--    'dependency_failed:<id>' (the first such in depends_on's order).
--
-- A unique or dedup job that finds an equal queued job gets that job's id
-- back, as from soniq_enqueue, and nothing else changes (the existing job
-- keeps its own dependencies).

CREATE FUNCTION {schema}.soniq_enqueue_after(
    depends_on uuid[],
    job_name text,
    args jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT 'default',
    priority integer DEFAULT 100,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT 4,
    unique_job boolean DEFAULT false,
    dedup_key text DEFAULT NULL,
    producer_id text DEFAULT NULL,
    job_id uuid DEFAULT NULL,
    any_outcome boolean DEFAULT false,
    result_ttl_seconds double precision DEFAULT 300
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_deps uuid[] := soniq_enqueue_after.depends_on;
    p_any boolean := coalesce(soniq_enqueue_after.any_outcome, false);
    p_ttl double precision := soniq_enqueue_after.result_ttl_seconds;
    v_id uuid := coalesce(soniq_enqueue_after.job_id, pg_catalog.gen_random_uuid());
    v_deps uuid[];
    v_states text[];
    v_gate text;
    v_found uuid;
    v_pending integer := 0;
    v_failed uuid;
    v_now timestamptz;
BEGIN
    IF p_deps IS NULL OR pg_catalog.cardinality(p_deps) > 1000
       OR (pg_catalog.cardinality(p_deps) > 0 AND pg_catalog.array_ndims(p_deps) <> 1)
       OR pg_catalog.array_position(p_deps, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'depends_on must be an array of at most 1000 job ids, none NULL'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
    END IF;
    IF p_ttl IS NULL OR p_ttl = 'NaN'::float8 OR p_ttl < 0 OR p_ttl > 31536000 THEN
        RAISE EXCEPTION 'result_ttl_seconds is out of range'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
    END IF;
    -- Each id once, in the order given.
    v_deps := ARRAY(SELECT d.id FROM pg_catalog.unnest(p_deps) WITH ORDINALITY AS d(id, i)
                     GROUP BY d.id ORDER BY pg_catalog.min(d.i));

    -- 1. Lock the dependencies (id order) and mark the ones that can still end.
    --    The protection trigger skips a plain write of an owned or live-claimed
    --    row: the mark goes through its gate.
    v_gate := pg_catalog.current_setting('soniq.fenced_write', true);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    PERFORM 1 FROM {schema}.soniq_jobs AS j
     WHERE j.id = ANY (v_deps) ORDER BY j.id FOR UPDATE;
    UPDATE {schema}.soniq_jobs AS j SET has_dependents = true
     WHERE j.id = ANY (v_deps) AND j.status IN ('queued', 'processing')
       AND j.has_dependents IS NOT TRUE;
    PERFORM pg_catalog.set_config('soniq.fenced_write', coalesce(v_gate, 'off'), true);

    -- 2. Their states, read after the locks; an unknown name refuses the call.
    v_states := ARRAY(
        SELECT CASE WHEN j.status = 'done' THEN 'done'
                    WHEN j.status = 'cancelled' THEN 'failed'
                    WHEN j.status IN ('queued', 'processing') THEN 'waiting'
                    WHEN j.id IS NULL
                         AND EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS x
                                      WHERE x.id = d.id) THEN 'failed'
               END
          FROM pg_catalog.unnest(v_deps) WITH ORDINALITY AS d(id, i)
          LEFT JOIN {schema}.soniq_jobs AS j ON j.id = d.id
         ORDER BY d.i);
    IF pg_catalog.array_position(v_states, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'a job named in depends_on does not exist'
            USING ERRCODE = '22023', HINT = 'SONIQ_UNKNOWN_DEPENDENCY';
    END IF;
    v_pending := pg_catalog.cardinality(pg_catalog.array_positions(v_states, 'waiting'));
    IF NOT p_any AND pg_catalog.array_position(v_states, 'failed') IS NOT NULL THEN
        v_failed := v_deps[pg_catalog.array_position(v_states, 'failed')];
    END IF;

    -- 3. The job, through soniq_enqueue (its checks, codes and duplicates).
    v_found := {schema}.soniq_enqueue(
        soniq_enqueue_after.job_name, soniq_enqueue_after.args, soniq_enqueue_after.queue,
        soniq_enqueue_after.priority,
        CASE WHEN v_pending > 0 OR v_failed IS NOT NULL
             THEN '9999-01-01 00:00:00+00'::timestamptz
             ELSE soniq_enqueue_after.run_at END,
        soniq_enqueue_after.max_attempts, soniq_enqueue_after.unique_job,
        soniq_enqueue_after.dedup_key, soniq_enqueue_after.producer_id, v_id);
    IF v_found IS DISTINCT FROM v_id THEN
        RETURN v_found;  -- an equal queued job's id: it stays as it is
    END IF;

    -- 4. The edges, and what is left to wait for.
    INSERT INTO {schema}.soniq_job_dependencies (job_id, depends_on, any_outcome, state)
    SELECT v_id, e.id, p_any, e.state
      FROM ROWS FROM (pg_catalog.unnest(v_deps), pg_catalog.unnest(v_states)) AS e(id, state);
    IF v_failed IS NOT NULL THEN
        -- 5. A dependency already failed: the job ends at once.
        v_now := pg_catalog.clock_timestamp();
        UPDATE {schema}.soniq_jobs AS j
           SET status = 'cancelled', last_error = 'dependency_failed:' || v_failed::text,
               scheduled_at = soniq_enqueue_after.run_at,
               expires_at = v_now + pg_catalog.make_interval(secs => p_ttl), updated_at = v_now
         WHERE j.id = v_id;
    ELSIF v_pending > 0 THEN
        INSERT INTO {schema}.soniq_job_waits (job_id, pending, run_at, created_at)
        VALUES (v_id, v_pending, soniq_enqueue_after.run_at, pg_catalog.clock_timestamp());
    END IF;
    RETURN v_id;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_enqueue_after(uuid[], text, jsonb, text, integer,
    timestamptz, integer, boolean, text, text, uuid, boolean, double precision) FROM PUBLIC;
