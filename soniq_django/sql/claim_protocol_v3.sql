-- soniq_django claim protocol, version 3 (PostgreSQL only): the protocol's edges.
--
-- Version 1 (claim_protocol_v1.sql) and version 2 (claim_protocol_v2.sql)
-- stay as they are; this file gives five of their functions new bodies with
-- the same names, signatures and grants, and adds two helpers. Loaded by
-- migration 0011_protocol_edges; never edited once released. The reverse
-- (claim_protocol_v3.down.sql, then the released bodies read back from
-- claim_protocol_v1.sql) restores version 1's behaviour exactly.
--
-- 1. A retry that cannot be queued because a twin holds its key. Unique jobs
--    and dedup keys only match queued rows, so a twin can be enqueued while
--    the job runs. When that job is then retried (soniq_fail with retry) or
--    its lapsed claim is re-queued by the reaper, the row cannot go back to
--    queued: soniq_jobs_unique_queued / soniq_jobs_dedup_queued (or Soniq's
--    idx_soniq_jobs_unique_queued / idx_soniq_jobs_dedup_key) already name
--    the twin. The rule: the attempt is finished as superseded -- status
--    cancelled, lease and pid cleared, kept for result_ttl_seconds, and
--    last_error saying which queued job took its place -- because the twin
--    is exactly the work a retry would have queued (an equal unique job, or
--    the job that now owns the dedup key). soniq_fail answers true: the
--    failure was recorded. soniq_requeue_v1 holds the rule once.
-- 2. The reaper settles each lapsed row on its own (a sub-block per row):
--    a row it cannot settle is left for later with a WARNING, and can never
--    make the claim that ran the reaper fail.
-- 3. A lapsed claim counts as an attempt against the same maximum
--    soniq_fail would use: max_attempts, or for a row that says NULL the
--    maximum the job's handler declares in soniq_task_registry (the
--    largest, when workers of several releases disagree), or 4, the
--    format-1 default and soniq_fail's own default. A job that kills its
--    worker on every attempt ends in the dead letters (max_retries_exceeded)
--    instead of being re-queued forever.
-- 4. The move to the dead letters never replaces a protected row's owned
--    submission identity (submission_id, fingerprint, fence_required) that a
--    dead-letter row of the same id already holds.
-- 5. soniq_request_cancel answers false, not NULL, for an unknown id, and
--    cancels at once a processing job whose lease has already lapsed (no
--    live worker is left to see a request).
-- 6. soniq_claim is a batch of one of soniq_claim_many (as soniq_complete is
--    of soniq_complete_many since version 2): one copy of the claim rules.

-- soniq_default_max_attempts_v1 --
-- The attempt limit of a job whose max_attempts is NULL: what its handler
-- declares in soniq_task_registry, else 4.
CREATE FUNCTION {schema}.soniq_default_max_attempts_v1(p_job_name text) RETURNS integer
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT coalesce(
        (SELECT pg_catalog.max(r.max_attempts) FROM {schema}.soniq_task_registry AS r
          WHERE r.task_name = p_job_name AND r.max_attempts >= 1),
        4)
$fn$;

-- soniq_requeue_v1 --
-- Put a locked processing row back in the queue (scheduled_at: p_scheduled_at,
-- or left as it is when NULL), or, when a queued twin holds its unique or
-- dedup key, finish it as superseded (cancelled, kept for p_ttl seconds).
-- Returns 'queued' or 'superseded'. The caller has opened the write gate.
CREATE FUNCTION {schema}.soniq_requeue_v1(
    p_job_id uuid, p_error text, p_scheduled_at timestamptz, p_now timestamptz,
    p_ttl double precision
) RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_constraint text;
    v_twin uuid;
    r record;
BEGIN
    BEGIN
        UPDATE {schema}.soniq_jobs AS j
           SET status = 'queued', last_error = p_error,
               scheduled_at = coalesce(p_scheduled_at, j.scheduled_at),
               lease_expires_at = NULL, pid = NULL, updated_at = p_now
         WHERE j.id = p_job_id;
        RETURN 'queued';
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS v_constraint = CONSTRAINT_NAME;
        IF v_constraint IS NULL OR v_constraint NOT IN
           ('soniq_jobs_unique_queued', 'idx_soniq_jobs_unique_queued',
            'soniq_jobs_dedup_queued', 'idx_soniq_jobs_dedup_key') THEN
            RAISE;
        END IF;
    END;
    SELECT j.job_name, j.args_hash, j.dedup_key INTO r
      FROM {schema}.soniq_jobs AS j WHERE j.id = p_job_id;
    SELECT t.id INTO v_twin FROM {schema}.soniq_jobs AS t
     WHERE t.status = 'queued' AND t.id <> p_job_id
       AND ((r.dedup_key IS NOT NULL AND t.dedup_key = r.dedup_key)
            OR (r.args_hash IS NOT NULL AND t.job_name = r.job_name AND t.args_hash = r.args_hash))
     LIMIT 1;
    UPDATE {schema}.soniq_jobs AS j
       SET status = 'cancelled',
           last_error = pg_catalog.format(
               'superseded: not queued again because queued job %s holds the same %s; '
               'this attempt ended with: %s',
               coalesce(v_twin::text, '(unknown)'),
               CASE WHEN v_constraint LIKE '%dedup%' THEN 'dedup_key' ELSE 'unique key' END,
               p_error),
           lease_expires_at = NULL, pid = NULL,
           expires_at = p_now + pg_catalog.make_interval(secs => p_ttl),
           updated_at = p_now
     WHERE j.id = p_job_id;
    RETURN 'superseded';
END
$fn$;

-- soniq_reap_lapsed_v1 (version 3 body; same signature) --
-- Settle up to `batch` owned claims whose lease has lapsed, each on its own:
-- a cancel-requested one becomes cancelled; one whose attempts reached its
-- limit (max_attempts, else soniq_default_max_attempts_v1) moves to the dead
-- letters (max_retries_exceeded); any other is queued again, or superseded
-- by a queued twin (soniq_requeue_v1). A row that cannot be settled is
-- skipped with a WARNING. Rows another transaction holds are skipped.
-- Returns how many were settled.
CREATE OR REPLACE FUNCTION {schema}.soniq_reap_lapsed_v1(batch integer, result_ttl_seconds double precision)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
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
        EXCEPTION WHEN OTHERS THEN
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

-- soniq_move_to_dead_letter_v1 (version 3 body; same signature) --
-- Move one locked job to soniq_dead_letter_jobs (delete + insert in this
-- transaction), keeping its id and owned submission identity. A dead-letter
-- row left by an earlier failure of the same (replayed) job is updated and
-- keeps its resurrection count -- and its owned identity, if it has one.
CREATE OR REPLACE FUNCTION {schema}.soniq_move_to_dead_letter_v1(
    p_job_id uuid, p_error text, p_reason text, p_dlq_record_id text
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    INSERT INTO {schema}.soniq_dead_letter_jobs AS d
        (id, job_name, args, queue, priority, max_attempts, attempts, last_error,
         dead_letter_reason, original_created_at, moved_to_dead_letter_at, resurrection_count,
         tags, fence_required, submission_id, submission_fingerprint)
    SELECT j.id, j.job_name, j.args, j.queue, j.priority, j.max_attempts, j.attempts,
           coalesce(p_error, j.last_error), p_reason, j.created_at, pg_catalog.clock_timestamp(), 0,
           CASE WHEN p_dlq_record_id IS NULL THEN NULL
                ELSE pg_catalog.jsonb_build_object('dlq_record_id', p_dlq_record_id) END,
           j.fence_required, j.submission_id, j.submission_fingerprint
      FROM {schema}.soniq_jobs AS j
     WHERE j.id = p_job_id
    ON CONFLICT (id) DO UPDATE
       SET job_name = EXCLUDED.job_name, args = EXCLUDED.args, queue = EXCLUDED.queue,
           priority = EXCLUDED.priority, max_attempts = EXCLUDED.max_attempts,
           attempts = EXCLUDED.attempts, last_error = EXCLUDED.last_error,
           dead_letter_reason = EXCLUDED.dead_letter_reason,
           moved_to_dead_letter_at = EXCLUDED.moved_to_dead_letter_at,
           tags = coalesce(EXCLUDED.tags, d.tags),
           -- A protected identity already here is never replaced.
           fence_required = d.fence_required OR EXCLUDED.fence_required,
           submission_id = CASE WHEN d.submission_id IS NOT NULL THEN d.submission_id
                                ELSE EXCLUDED.submission_id END,
           submission_fingerprint = CASE WHEN d.submission_id IS NOT NULL
                                         THEN d.submission_fingerprint
                                         ELSE EXCLUDED.submission_fingerprint END;
    DELETE FROM {schema}.soniq_jobs AS j WHERE j.id = p_job_id;
END
$fn$;

-- soniq_fail (version 3 body; same signature and answers as version 1) --
-- Record a failed attempt of the exact live claim. With retry and attempts
-- left (max_attempts, or default_max_attempts when the row says NULL) the
-- job is queued again retry_delay_seconds from now -- by default an
-- exponential backoff, retry_base_seconds * 2^(attempts - 1) capped at
-- retry_max_seconds, with jitter down to half of it -- or, when a queued
-- twin holds its unique or dedup key, finished as superseded by it (see the
-- top of this file); otherwise it moves to the dead letters with reason
-- max_retries_exceeded (retry) or dead_letter_reason (no retry:
-- permanent_failure unless the worker says job_not_found or
-- invalid_arguments). Refused while a cancel is requested.
CREATE OR REPLACE FUNCTION {schema}.soniq_fail(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    error text, retry boolean,
    retry_delay_seconds double precision DEFAULT NULL,
    dead_letter_reason text DEFAULT 'permanent_failure',
    dlq_record_id text DEFAULT NULL,
    default_max_attempts integer DEFAULT 4,
    retry_base_seconds double precision DEFAULT 2,
    retry_max_seconds double precision DEFAULT 3600
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    r record;
BEGIN
    IF soniq_fail.retry IS NULL OR soniq_fail.error IS NULL
       OR soniq_fail.dead_letter_reason IS NULL
       OR soniq_fail.dead_letter_reason NOT IN
          ('permanent_failure', 'job_not_found', 'invalid_arguments', 'max_retries_exceeded')
       OR (soniq_fail.dlq_record_id IS NOT NULL
           AND (soniq_fail.dlq_record_id = '' OR pg_catalog.length(soniq_fail.dlq_record_id) > 32))
       OR soniq_fail.default_max_attempts IS NULL OR soniq_fail.default_max_attempts < 1 THEN
        RAISE EXCEPTION 'invalid failure report' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF soniq_fail.retry_delay_seconds IS NOT NULL THEN
        PERFORM {schema}.soniq_check_seconds_v1(retry_delay_seconds, 'retry_delay_seconds', true);
    END IF;
    PERFORM {schema}.soniq_check_seconds_v1(retry_base_seconds, 'retry_base_seconds', true);
    PERFORM {schema}.soniq_check_seconds_v1(retry_max_seconds, 'retry_max_seconds', true);
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_fail.job_id, soniq_fail.worker_id, soniq_fail.generation,
        soniq_fail.claim_token, soniq_fail.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    SELECT j.attempts, j.max_attempts, j.cancel_requested INTO r
      FROM {schema}.soniq_jobs AS j WHERE j.id = soniq_fail.job_id::uuid;
    IF r.cancel_requested THEN
        RETURN false;
    END IF;
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    IF soniq_fail.retry AND r.attempts < coalesce(r.max_attempts, soniq_fail.default_max_attempts) THEN
        -- The row is locked and its whole fence was checked after the lock
        -- (soniq_lock_fence_v1): it is this claim's, live, until we commit.
        PERFORM {schema}.soniq_requeue_v1(
            soniq_fail.job_id::uuid, soniq_fail.error,
            v_now + pg_catalog.make_interval(secs => coalesce(
                soniq_fail.retry_delay_seconds,
                LEAST(soniq_fail.retry_max_seconds,
                      soniq_fail.retry_base_seconds
                      * pg_catalog.power(2::float8, LEAST(GREATEST(r.attempts - 1, 0), 60)))
                * (0.5 + 0.5 * pg_catalog.random()))),
            v_now, 300);
    ELSE
        PERFORM {schema}.soniq_move_to_dead_letter_v1(
            soniq_fail.job_id::uuid, soniq_fail.error,
            CASE WHEN soniq_fail.retry THEN 'max_retries_exceeded'
                 ELSE soniq_fail.dead_letter_reason END,
            soniq_fail.dlq_record_id);
    END IF;
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
    RETURN true;
END
$fn$;

-- soniq_request_cancel (version 3 body; same signature) --
-- Administrative cancel: a queued job is cancelled at once, and so is a
-- processing job whose lease has already lapsed (no live worker is left to
-- see a request); a processing job with a live lease gets a cancel request
-- its worker sees on its next heartbeat. Returns false for a job that is
-- missing or already finished. Keeps any owned submission identity.
CREATE OR REPLACE FUNCTION {schema}.soniq_request_cancel(
    job_id uuid, result_ttl_seconds double precision DEFAULT 300
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r record;
    v_now timestamptz;
BEGIN
    PERFORM {schema}.soniq_check_seconds_v1(result_ttl_seconds, 'result_ttl_seconds', true);
    SELECT j.status, j.lease_expires_at INTO r FROM {schema}.soniq_jobs AS j
     WHERE j.id = soniq_request_cancel.job_id FOR UPDATE;
    IF NOT FOUND OR r.status NOT IN ('queued', 'processing') THEN
        RETURN false;
    END IF;
    v_now := pg_catalog.clock_timestamp();  -- after the lock
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    IF r.status = 'queued' OR r.lease_expires_at IS NULL OR r.lease_expires_at <= v_now THEN
        UPDATE {schema}.soniq_jobs AS j
           SET status = 'cancelled', lease_expires_at = NULL, pid = NULL,
               cancel_requested = (r.status = 'processing'),
               expires_at = v_now + pg_catalog.make_interval(secs => result_ttl_seconds),
               updated_at = v_now
         WHERE j.id = soniq_request_cancel.job_id;
    ELSE
        UPDATE {schema}.soniq_jobs AS j
           SET cancel_requested = true, updated_at = v_now
         WHERE j.id = soniq_request_cancel.job_id;
    END IF;
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
    RETURN true;
END
$fn$;

-- soniq_claim (version 3 body; same signature, answers and error codes as version 1) --
-- Claim the next eligible job for worker_id with the fresh nonce
-- claim_token: the first queued, due job by (priority, created_at) in the
-- given queues (NULL: any queue). Returns one row, or none when nothing is
-- eligible. A batch of one: soniq_claim_many holds the only copy of the rules.
CREATE OR REPLACE FUNCTION {schema}.soniq_claim(
    worker_id text,
    claim_token text,
    queues text[] DEFAULT NULL,
    lease_seconds double precision DEFAULT 30,
    result_ttl_seconds double precision DEFAULT 300,
    pid integer DEFAULT NULL
) RETURNS TABLE (
    job_id uuid, job_name text, args jsonb, queue text, priority integer, attempts integer,
    max_attempts integer, lease_expires_at timestamptz, generation bigint,
    owner text, token text
)
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT * FROM {schema}.soniq_claim_many(
        worker_id, ARRAY[claim_token], queues, lease_seconds, result_ttl_seconds, pid)
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_default_max_attempts_v1(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_requeue_v1(uuid, text, timestamptz, timestamptz, double precision) FROM PUBLIC;
