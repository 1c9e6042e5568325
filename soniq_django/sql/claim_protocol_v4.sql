-- soniq_django claim protocol, version 4 (PostgreSQL only): giving a claim back.
--
-- Versions 1 to 3 stay as they are; this file adds one function and changes
-- no other. Loaded by migration 0012_claim_protocol_v4; never edited once
-- released. The reverse (claim_protocol_v4.down.sql) drops it.
--
-- A worker that claimed a job it should not run now -- above all one whose
-- job name it has no handler for, during a rolling deploy where another
-- release does -- gives the claim back with soniq_defer: the job is queued
-- again for later and the claim does not count as an attempt. soniq_fail
-- cannot do this: a retry spends an attempt, so old workers would use up a
-- new handler's attempts (and end in max_retries_exceeded) before any new
-- worker saw the job.

-- soniq_defer --
-- Give the exact live claim back: the job is queued again delay_seconds from
-- now with error as its last_error, and the attempt the claim counted is
-- taken back (attempts - 1, never below 0). The generation stays raised, so
-- this fence -- and every older one -- owns nothing afterwards. When a
-- queued twin holds the job's unique or dedup key, the job is finished as
-- superseded instead (cancelled, kept for result_ttl_seconds), as soniq_fail
-- does with a retry. True when applied; false when the fence does not own
-- the job (missing, stale, expired, finished) or a cancel is requested.
CREATE FUNCTION {schema}.soniq_defer(
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
    v_cancel boolean;
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
    SELECT j.cancel_requested INTO v_cancel
      FROM {schema}.soniq_jobs AS j WHERE j.id = soniq_defer.job_id::uuid;
    IF v_cancel THEN  -- the worker must acknowledge the cancel instead
        RETURN false;
    END IF;
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

REVOKE ALL ON FUNCTION {schema}.soniq_defer(text, text, bigint, text, text, text, double precision, double precision) FROM PUBLIC;
