-- Reverse of claim_protocol_v2.sql: no soniq_claim_many or soniq_complete_many,
-- and soniq_complete with its version 1 body again (copied unchanged from
-- claim_protocol_v1.sql).
DROP FUNCTION {schema}.soniq_claim_many(text, text[], text[], double precision, double precision, integer);
DROP FUNCTION {schema}.soniq_complete_many(text[], text, bigint[], text[], text[], jsonb[], double precision);

CREATE OR REPLACE FUNCTION {schema}.soniq_complete(
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
