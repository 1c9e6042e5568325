-- soniq_django claim protocol, version 1 (PostgreSQL only).
--
-- The worker contract for any language: claim a job with a fresh nonce,
-- then heartbeat, complete, fail, record a pid, read the cancel request and
-- acknowledge it -- each one round trip, each fenced. docs/claim-protocol.md
-- explains it for implementers. Loaded by migration 0004_claim_protocol with
-- {schema} replaced by the schema of the soniq tables; never edited once
-- released (a new version gets a new file and a new migration).
--
-- Fencing. A claim stores (owner, token, generation) on the row and a lease
-- end. Every later operation presents the whole fence -- job id (canonical
-- text), queue, owner, generation, token -- and first LOCKS the row, THEN
-- reads clock_timestamp() (now() is the transaction's start and would let a
-- write that waited on the lock past the lease through), compares the locked
-- row with the fence byte for byte (COLLATE "C": no case folding, no
-- padding) and requires status 'processing' and a lease strictly after that
-- time. The UPDATE repeats the whole predicate.
--
-- Errors: SQLSTATE 22023 with HINT 'CONFIG' for invalid input; P0001 with
-- HINT 'QUEUE_CLAIM_CONFLICT' and DETAIL naming the reason for claim
-- conflicts; 23505 on soniq_jobs_claim_token_key when two claims race with
-- one nonce; 22P02 for a job id that is not a UUID.
--
-- Protected rows. soniq_protect_owned_v1 stops UPDATE/DELETE of owned
-- submissions and of live owned claims by anything but these functions
-- (an older, id-only worker, a hand-written UPDATE): such writes are skipped.
-- These functions open the gate with the transaction-local setting
-- soniq.fenced_write around their own writes.

-- soniq_check_identity_v1 --
-- Raise 22023/CONFIG unless value is a non-empty string of at most 255 characters.
CREATE FUNCTION {schema}.soniq_check_identity_v1(value text, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF value IS NULL OR value = '' OR pg_catalog.length(value) > 255 THEN
        RAISE EXCEPTION '% must be a non-empty string of at most 255 characters', what
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
END
$fn$;

-- soniq_check_lease_v1 --
-- Raise 22023/CONFIG unless seconds is a positive, finite number of at most a day.
CREATE FUNCTION {schema}.soniq_check_seconds_v1(seconds double precision, what text, allow_zero boolean)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF seconds IS NULL OR seconds = 'NaN'::float8 OR seconds < 0 OR (seconds = 0 AND NOT allow_zero)
       OR seconds > 31536000 THEN
        RAISE EXCEPTION '% is out of range', what USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
END
$fn$;

-- soniq_fenced_write_v1 --
-- Open (true) or close (false) the gate of soniq_protect_owned_v1 for this transaction.
CREATE FUNCTION {schema}.soniq_fenced_write_v1(open boolean) RETURNS void
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT NULL::void FROM pg_catalog.set_config(
        'soniq.fenced_write', CASE WHEN open THEN 'on' ELSE 'off' END, true)
$fn$;

-- soniq_protect_owned_v1 --
-- Trigger: skip writes to protected rows that do not come through the gate.
CREATE FUNCTION {schema}.soniq_protect_owned_v1() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF pg_catalog.current_setting('soniq.fenced_write', true) = 'on' THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER soniq_protect_owned
    BEFORE UPDATE OR DELETE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.fence_required OR (OLD.claim_token IS NOT NULL AND OLD.status = 'processing'))
    EXECUTE FUNCTION {schema}.soniq_protect_owned_v1();

-- soniq_reap_lapsed_v1 --
-- Settle up to `batch` owned claims whose lease has lapsed (their worker
-- died or lost the lease): a cancel-requested one becomes cancelled, never
-- runnable again; one with no attempts left moves to the dead letters
-- (max_retries_exceeded); any other is queued again. Rows another
-- transaction holds are skipped. Returns how many were settled.
CREATE FUNCTION {schema}.soniq_reap_lapsed_v1(batch integer, result_ttl_seconds double precision)
RETURNS integer
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r record;
    v_now timestamptz;
    v_count integer := 0;
BEGIN
    FOR r IN
        SELECT j.* FROM {schema}.soniq_jobs AS j
         WHERE j.status = 'processing' AND j.lease_expires_at <= pg_catalog.clock_timestamp()
         ORDER BY j.lease_expires_at
         LIMIT batch
           FOR UPDATE SKIP LOCKED
    LOOP
        IF v_count = 0 THEN
            -- Only now: in the common case nothing lapsed and nothing is written.
            PERFORM {schema}.soniq_fenced_write_v1(true);
        END IF;
        v_now := pg_catalog.clock_timestamp();
        IF r.cancel_requested THEN
            UPDATE {schema}.soniq_jobs AS j
               SET status = 'cancelled', lease_expires_at = NULL, pid = NULL,
                   expires_at = v_now + pg_catalog.make_interval(secs => result_ttl_seconds),
                   updated_at = v_now
             WHERE j.id = r.id;
        ELSIF r.max_attempts IS NOT NULL AND r.attempts >= r.max_attempts THEN
            PERFORM {schema}.soniq_move_to_dead_letter_v1(
                r.id, 'lease lapsed with no attempts left', 'max_retries_exceeded', NULL);
        ELSE
            UPDATE {schema}.soniq_jobs AS j
               SET status = 'queued', lease_expires_at = NULL, pid = NULL,
                   last_error = 'lease lapsed: the worker stopped heartbeating',
                   updated_at = v_now
             WHERE j.id = r.id;
        END IF;
        v_count := v_count + 1;
    END LOOP;
    IF v_count > 0 THEN
        PERFORM {schema}.soniq_fenced_write_v1(false);
    END IF;
    RETURN v_count;
END
$fn$;

-- soniq_move_to_dead_letter_v1 --
-- Move one locked job to soniq_dead_letter_jobs (delete + insert in this
-- transaction), keeping its id and owned submission identity. A dead-letter
-- row left by an earlier failure of the same (replayed) job is updated and
-- keeps its resurrection count.
CREATE FUNCTION {schema}.soniq_move_to_dead_letter_v1(
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
           fence_required = EXCLUDED.fence_required, submission_id = EXCLUDED.submission_id,
           submission_fingerprint = EXCLUDED.submission_fingerprint;
    DELETE FROM {schema}.soniq_jobs AS j WHERE j.id = p_job_id;
END
$fn$;

-- soniq_claim --
-- Claim the next eligible job for worker_id with the fresh nonce
-- claim_token: the first queued, due job by (priority, created_at) in the
-- given queues (NULL: any queue). Returns one row, or none when nothing is
-- eligible. generation rises by one on every claim, attempts too. pid, if
-- given, is recorded in the same write (the worker's process id).
CREATE FUNCTION {schema}.soniq_claim(
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
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_owner text := soniq_claim.worker_id;
    p_token text := soniq_claim.claim_token;
    p_queues text[] := soniq_claim.queues;
    v_id uuid;
    v_generation bigint;
    v_now timestamptz;
    r record;
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(p_owner, 'worker_id');
    PERFORM {schema}.soniq_check_identity_v1(p_token, 'claim_token');
    PERFORM {schema}.soniq_check_seconds_v1(lease_seconds, 'lease_seconds', false);
    PERFORM {schema}.soniq_check_seconds_v1(result_ttl_seconds, 'result_ttl_seconds', true);
    IF soniq_claim.pid IS NOT NULL AND soniq_claim.pid < 1 THEN
        RAISE EXCEPTION 'pid must be a positive integer' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.claim_token = p_token) THEN
        RAISE EXCEPTION 'claim token was used before' USING ERRCODE = 'P0001',
            HINT = 'QUEUE_CLAIM_CONFLICT', DETAIL = 'nonce_reused';
    END IF;

    PERFORM {schema}.soniq_reap_lapsed_v1(10, result_ttl_seconds);

    -- SKIP LOCKED: concurrent claimers each take a different row instead of
    -- queueing behind one lock. The partial index on queued rows serves
    -- both the filter and the order.
    SELECT j.id, j.claim_generation INTO v_id, v_generation
      FROM {schema}.soniq_jobs AS j
     WHERE j.status = 'queued'
       AND (p_queues IS NULL OR j.queue = ANY (p_queues))
       AND (j.scheduled_at IS NULL OR j.scheduled_at <= pg_catalog.clock_timestamp())
     ORDER BY j.priority, j.created_at
     LIMIT 1
       FOR UPDATE SKIP LOCKED;
    IF v_id IS NULL THEN
        RETURN;
    END IF;
    IF v_generation >= 9223372036854775807 THEN
        RAISE EXCEPTION 'claim generation is exhausted' USING ERRCODE = 'P0001',
            HINT = 'QUEUE_CLAIM_CONFLICT', DETAIL = 'generation_exhausted';
    END IF;

    v_now := pg_catalog.clock_timestamp();  -- after the lock
    PERFORM {schema}.soniq_fenced_write_v1(true);
    UPDATE {schema}.soniq_jobs AS j
       SET status = 'processing',
           attempts = j.attempts + 1,
           claim_generation = j.claim_generation + 1,
           claim_owner = p_owner,
           claim_token = p_token,
           -- worker_id names a soniq_workers row (Soniq declares a foreign
           -- key there): set only when the owner is a registered worker.
           worker_id = (SELECT w.id FROM {schema}.soniq_workers AS w
                         WHERE p_owner ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                           AND w.id = p_owner::uuid),
           lease_expires_at = v_now + pg_catalog.make_interval(secs => lease_seconds),
           cancel_requested = false,
           pid = soniq_claim.pid,
           updated_at = v_now
     WHERE j.id = v_id
    RETURNING j.* INTO r;
    PERFORM {schema}.soniq_fenced_write_v1(false);

    -- The owner, nonce and generation must be stored exactly as sent; a
    -- coercing column or a trigger that changed them voids the whole claim.
    IF r.claim_owner IS NULL OR r.claim_owner COLLATE "C" <> p_owner COLLATE "C"
       OR r.claim_token IS NULL OR r.claim_token COLLATE "C" <> p_token COLLATE "C"
       OR r.claim_generation IS DISTINCT FROM v_generation + 1 THEN
        RAISE EXCEPTION 'the stored claim identity differs from the one sent'
            USING ERRCODE = 'P0001', HINT = 'QUEUE_CLAIM_CONFLICT',
                  DETAIL = 'claim_identity_changed';
    END IF;
    RETURN QUERY SELECT r.id, r.job_name, r.args, r.queue, r.priority, r.attempts,
        r.max_attempts, r.lease_expires_at, r.claim_generation, r.claim_owner::text,
        r.claim_token::text;
END
$fn$;

-- soniq_recover_claim --
-- The live claim made with this owner and nonce, if any: for a caller that
-- does not know whether its soniq_claim committed. Claims nothing and does
-- not renew the lease.
CREATE FUNCTION {schema}.soniq_recover_claim(worker_id text, claim_token text)
RETURNS TABLE (
    job_id uuid, job_name text, args jsonb, queue text, priority integer, attempts integer,
    max_attempts integer, lease_expires_at timestamptz, generation bigint,
    owner text, token text
)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_owner text := soniq_recover_claim.worker_id;
    p_token text := soniq_recover_claim.claim_token;
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(p_owner, 'worker_id');
    PERFORM {schema}.soniq_check_identity_v1(p_token, 'claim_token');
    RETURN QUERY
        SELECT j.id, j.job_name, j.args, j.queue, j.priority, j.attempts, j.max_attempts,
               j.lease_expires_at, j.claim_generation, j.claim_owner::text, j.claim_token::text
          FROM {schema}.soniq_jobs AS j
         WHERE j.claim_token = p_token
           AND j.claim_token COLLATE "C" = p_token COLLATE "C"
           AND j.claim_owner COLLATE "C" = p_owner COLLATE "C"
           AND j.status = 'processing'
           AND j.lease_expires_at > pg_catalog.clock_timestamp();
END
$fn$;

-- soniq_lock_fence_v1 --
-- Lock the fenced row, then take the time. Returns that time when the
-- locked row matches the whole fence, is processing and its lease is still
-- running; NULL otherwise (missing, stale, expired or terminal).
CREATE FUNCTION {schema}.soniq_lock_fence_v1(
    p_job_id text, p_owner text, p_generation bigint, p_token text, p_queue text
) RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r record;
    v_now timestamptz;
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(p_owner, 'worker_id');
    PERFORM {schema}.soniq_check_identity_v1(p_token, 'claim_token');
    IF p_generation IS NULL OR p_generation < 1 OR p_queue IS NULL OR p_job_id IS NULL THEN
        RAISE EXCEPTION 'invalid fence' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    SELECT j.id, j.queue, j.claim_owner, j.claim_generation, j.claim_token, j.status,
           j.lease_expires_at
      INTO r
      FROM {schema}.soniq_jobs AS j
     WHERE j.id = p_job_id::uuid
       FOR UPDATE;
    v_now := pg_catalog.clock_timestamp();  -- after the lock
    IF NOT FOUND
       OR r.id::text COLLATE "C" <> p_job_id COLLATE "C"
       OR r.queue COLLATE "C" <> p_queue COLLATE "C"
       OR r.claim_owner IS NULL OR r.claim_owner COLLATE "C" <> p_owner COLLATE "C"
       OR r.claim_token IS NULL OR r.claim_token COLLATE "C" <> p_token COLLATE "C"
       OR r.claim_generation <> p_generation
       OR r.status <> 'processing'
       OR r.lease_expires_at IS NULL OR r.lease_expires_at <= v_now THEN
        RETURN NULL;
    END IF;
    RETURN v_now;
END
$fn$;

-- soniq_heartbeat --
-- Renew the lease of the exact live claim: lease ends lease_seconds from now.
-- Allowed while a cancel is requested, so a worker can clean up.
CREATE FUNCTION {schema}.soniq_heartbeat(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    lease_seconds double precision DEFAULT 30
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_done boolean;
BEGIN
    PERFORM {schema}.soniq_check_seconds_v1(lease_seconds, 'lease_seconds', false);
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_heartbeat.job_id, soniq_heartbeat.worker_id, soniq_heartbeat.generation,
        soniq_heartbeat.claim_token, soniq_heartbeat.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    PERFORM {schema}.soniq_fenced_write_v1(true);
    UPDATE {schema}.soniq_jobs AS j
       SET lease_expires_at = v_now + pg_catalog.make_interval(secs => lease_seconds),
           updated_at = v_now
     WHERE j.id = soniq_heartbeat.job_id::uuid
       AND j.claim_token = soniq_heartbeat.claim_token
       AND j.claim_generation = soniq_heartbeat.generation
       AND j.status = 'processing' AND j.lease_expires_at > v_now;
    v_done := FOUND;
    PERFORM {schema}.soniq_fenced_write_v1(false);
    RETURN v_done;
END
$fn$;

-- soniq_complete --
-- Finish the exact live claim with result (any JSON, or NULL): status done,
-- lease and pid cleared, row kept for result_ttl_seconds. Refused (false)
-- while a cancel is requested, and when already completed.
CREATE FUNCTION {schema}.soniq_complete(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    result jsonb DEFAULT NULL, result_ttl_seconds double precision DEFAULT 300
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_done boolean;
BEGIN
    PERFORM {schema}.soniq_check_seconds_v1(result_ttl_seconds, 'result_ttl_seconds', true);
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_complete.job_id, soniq_complete.worker_id, soniq_complete.generation,
        soniq_complete.claim_token, soniq_complete.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    PERFORM {schema}.soniq_fenced_write_v1(true);
    UPDATE {schema}.soniq_jobs AS j
       SET status = 'done', result = soniq_complete.result,
           lease_expires_at = NULL, pid = NULL,
           expires_at = v_now + pg_catalog.make_interval(secs => result_ttl_seconds),
           updated_at = v_now
     WHERE j.id = soniq_complete.job_id::uuid
       AND j.claim_token = soniq_complete.claim_token
       AND j.claim_generation = soniq_complete.generation
       AND j.status = 'processing' AND j.lease_expires_at > v_now
       AND NOT j.cancel_requested;
    v_done := FOUND;
    PERFORM {schema}.soniq_fenced_write_v1(false);
    RETURN v_done;
END
$fn$;

-- soniq_fail --
-- Record a failed attempt of the exact live claim. With retry and attempts
-- left (max_attempts, or default_max_attempts when the row says NULL) the
-- job is queued again retry_delay_seconds from now -- by default an
-- exponential backoff, retry_base_seconds * 2^(attempts - 1) capped at
-- retry_max_seconds, with jitter down to half of it; otherwise it moves to
-- the dead letters with reason max_retries_exceeded (retry) or
-- dead_letter_reason (no retry: permanent_failure unless the worker says
-- job_not_found or invalid_arguments). Refused while a cancel is requested.
CREATE FUNCTION {schema}.soniq_fail(
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
    v_done boolean;
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
    PERFORM {schema}.soniq_fenced_write_v1(true);
    IF soniq_fail.retry AND r.attempts < coalesce(r.max_attempts, soniq_fail.default_max_attempts) THEN
        UPDATE {schema}.soniq_jobs AS j
           SET status = 'queued', last_error = soniq_fail.error,
               scheduled_at = v_now + pg_catalog.make_interval(secs => coalesce(
                   soniq_fail.retry_delay_seconds,
                   LEAST(soniq_fail.retry_max_seconds,
                         soniq_fail.retry_base_seconds
                         * pg_catalog.power(2::float8, LEAST(GREATEST(r.attempts - 1, 0), 60)))
                   * (0.5 + 0.5 * pg_catalog.random()))),
               lease_expires_at = NULL, pid = NULL, updated_at = v_now
         WHERE j.id = soniq_fail.job_id::uuid
           AND j.claim_token = soniq_fail.claim_token
           AND j.claim_generation = soniq_fail.generation
           AND j.status = 'processing' AND j.lease_expires_at > v_now;
        v_done := FOUND;
    ELSE
        PERFORM {schema}.soniq_move_to_dead_letter_v1(
            soniq_fail.job_id::uuid, soniq_fail.error,
            CASE WHEN soniq_fail.retry THEN 'max_retries_exceeded'
                 ELSE soniq_fail.dead_letter_reason END,
            soniq_fail.dlq_record_id);
        v_done := true;
    END IF;
    PERFORM {schema}.soniq_fenced_write_v1(false);
    RETURN v_done;
END
$fn$;

-- soniq_set_pid --
-- Record the OS process id running the exact live claim. Refused while a
-- cancel is requested.
CREATE FUNCTION {schema}.soniq_set_pid(
    job_id text, worker_id text, generation bigint, claim_token text, queue text, pid integer
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_done boolean;
BEGIN
    IF soniq_set_pid.pid IS NULL OR soniq_set_pid.pid < 1 THEN
        RAISE EXCEPTION 'pid must be a positive integer' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_set_pid.job_id, soniq_set_pid.worker_id, soniq_set_pid.generation,
        soniq_set_pid.claim_token, soniq_set_pid.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    PERFORM {schema}.soniq_fenced_write_v1(true);
    UPDATE {schema}.soniq_jobs AS j
       SET pid = soniq_set_pid.pid, updated_at = v_now
     WHERE j.id = soniq_set_pid.job_id::uuid
       AND j.claim_token = soniq_set_pid.claim_token
       AND j.claim_generation = soniq_set_pid.generation
       AND j.status = 'processing' AND j.lease_expires_at > v_now
       AND NOT j.cancel_requested;
    v_done := FOUND;
    PERFORM {schema}.soniq_fenced_write_v1(false);
    RETURN v_done;
END
$fn$;

-- soniq_get_state --
-- The cancel request and pid of the exact live claim; no row when the
-- fence no longer owns the job. A snapshot, not a permission.
CREATE FUNCTION {schema}.soniq_get_state(
    job_id text, worker_id text, generation bigint, claim_token text, queue text
) RETURNS TABLE (cancel_requested boolean, pid integer)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_get_state.job_id, soniq_get_state.worker_id, soniq_get_state.generation,
        soniq_get_state.claim_token, soniq_get_state.queue);
    IF v_now IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT j.cancel_requested, j.pid FROM {schema}.soniq_jobs AS j
                  WHERE j.id = soniq_get_state.job_id::uuid;
END
$fn$;

-- soniq_acknowledge_cancel --
-- The worker confirms it stopped a cancel-requested job: status cancelled,
-- lease and pid cleared (which also frees its active key). Needs the live
-- fence and a pending cancel request.
CREATE FUNCTION {schema}.soniq_acknowledge_cancel(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    result_ttl_seconds double precision DEFAULT 300
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_done boolean;
BEGIN
    PERFORM {schema}.soniq_check_seconds_v1(result_ttl_seconds, 'result_ttl_seconds', true);
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_acknowledge_cancel.job_id, soniq_acknowledge_cancel.worker_id,
        soniq_acknowledge_cancel.generation, soniq_acknowledge_cancel.claim_token,
        soniq_acknowledge_cancel.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    PERFORM {schema}.soniq_fenced_write_v1(true);
    UPDATE {schema}.soniq_jobs AS j
       SET status = 'cancelled', lease_expires_at = NULL, pid = NULL,
           expires_at = v_now + pg_catalog.make_interval(secs => result_ttl_seconds),
           updated_at = v_now
     WHERE j.id = soniq_acknowledge_cancel.job_id::uuid
       AND j.claim_token = soniq_acknowledge_cancel.claim_token
       AND j.claim_generation = soniq_acknowledge_cancel.generation
       AND j.status = 'processing' AND j.lease_expires_at > v_now
       AND j.cancel_requested;
    v_done := FOUND;
    PERFORM {schema}.soniq_fenced_write_v1(false);
    RETURN v_done;
END
$fn$;

-- soniq_request_cancel --
-- Administrative cancel: a queued job is cancelled at once; a processing
-- job gets a cancel request its worker sees on its next heartbeat. Returns
-- false for a job that is missing or already finished. Keeps any owned
-- submission identity.
CREATE FUNCTION {schema}.soniq_request_cancel(
    job_id uuid, result_ttl_seconds double precision DEFAULT 300
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_status text;
    v_now timestamptz;
BEGIN
    PERFORM {schema}.soniq_check_seconds_v1(result_ttl_seconds, 'result_ttl_seconds', true);
    SELECT j.status INTO v_status FROM {schema}.soniq_jobs AS j
     WHERE j.id = soniq_request_cancel.job_id FOR UPDATE;
    v_now := pg_catalog.clock_timestamp();
    PERFORM {schema}.soniq_fenced_write_v1(true);
    IF v_status = 'queued' THEN
        UPDATE {schema}.soniq_jobs AS j
           SET status = 'cancelled', lease_expires_at = NULL, pid = NULL,
               expires_at = v_now + pg_catalog.make_interval(secs => result_ttl_seconds),
               updated_at = v_now
         WHERE j.id = soniq_request_cancel.job_id;
    ELSIF v_status = 'processing' THEN
        UPDATE {schema}.soniq_jobs AS j
           SET cancel_requested = true, updated_at = v_now
         WHERE j.id = soniq_request_cancel.job_id;
    END IF;
    PERFORM {schema}.soniq_fenced_write_v1(false);
    RETURN v_status IN ('queued', 'processing');
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_check_identity_v1(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_check_seconds_v1(double precision, text, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_fenced_write_v1(boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_protect_owned_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_reap_lapsed_v1(integer, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_move_to_dead_letter_v1(uuid, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_claim(text, text, text[], double precision, double precision, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_recover_claim(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_lock_fence_v1(text, text, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_heartbeat(text, text, bigint, text, text, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_complete(text, text, bigint, text, text, jsonb, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_fail(text, text, bigint, text, text, text, boolean, double precision, text, text, integer, double precision, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_set_pid(text, text, bigint, text, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_get_state(text, text, bigint, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_acknowledge_cancel(text, text, bigint, text, text, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_request_cancel(uuid, double precision) FROM PUBLIC;
