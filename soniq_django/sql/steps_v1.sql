-- soniq_django durable steps, version 1 (PostgreSQL). Loaded by migration
-- 0028_job_steps after it made the table soniq_job_steps; never edited once
-- released. Its reverse is steps_v1.down.sql; the SQLite twin of the purge is
-- sqlite/steps_v1.sql, of the two functions soniq_django/steps/store.py. See
-- docs/steps.md and docs/decisions/0046-durable-steps.md.
--
-- A step is one row of soniq_job_steps: (job_id, name) -> its JSON result,
-- the attempt and claim generation that recorded it, when, and its size.
-- soniq_get_step reads it; soniq_record_step writes it under the claim's
-- full fence: the job's row locked, then the time read (clock_timestamp()
-- after the lock), then nonce, generation, queue, owner, status and lease
-- compared, exactly as soniq_complete's fence (soniq_lock_fence_v1), and,
-- as soniq_complete, refused while a cancel is requested. A run that lost
-- its claim records nothing. Sent as the last statement of a transaction
-- that also holds the step's own writes (an atomic step), the row lock it
-- takes is held to the COMMIT: nobody can re-claim the job, or end it, in
-- between, so the writes and the record commit only if the claim held at
-- the moment the lock was taken -- and the record is the COMMIT's witness:
-- a lost COMMIT is settled by reading it back once the row lock is free.
--
-- Rows go with their job, as soniq_job_progress' do: statement triggers on
-- DELETE of either job table, the rows of ids in neither table deleted. A
-- replayed dead letter keeps its steps (the id is in soniq_dead_letter_jobs
-- throughout), so its next run resumes after them.

-- soniq_get_step --
-- The recorded result of step `name` of the exact live claim. One row:
-- held (false: the fence does not hold -- missing, stale, expired or
-- terminal; recorded and result are then false and NULL), recorded, and
-- result (the JSON recorded, which may be JSON null). Takes no lock: a
-- plain read, so a lookup never waits behind a heartbeat.
CREATE FUNCTION {schema}.soniq_get_step(
    job_id text, worker_id text, generation bigint, claim_token text, queue text, name text
) RETURNS TABLE (held boolean, recorded boolean, result jsonb)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(soniq_get_step.worker_id, 'worker_id');
    PERFORM {schema}.soniq_check_identity_v1(soniq_get_step.claim_token, 'claim_token');
    IF soniq_get_step.generation IS NULL OR soniq_get_step.generation < 1
       OR soniq_get_step.queue IS NULL OR soniq_get_step.job_id IS NULL THEN
        RAISE EXCEPTION 'invalid fence' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    SELECT j.id, j.queue, j.claim_owner, j.claim_generation, j.claim_token, j.status,
           j.lease_expires_at
      INTO r
      FROM {schema}.soniq_jobs AS j
     WHERE j.id = soniq_get_step.job_id::uuid;
    IF NOT FOUND
       OR r.id::text COLLATE "C" <> soniq_get_step.job_id COLLATE "C"
       OR r.queue COLLATE "C" <> soniq_get_step.queue COLLATE "C"
       OR r.claim_owner IS NULL
       OR r.claim_owner COLLATE "C" <> soniq_get_step.worker_id COLLATE "C"
       OR r.claim_token IS NULL
       OR r.claim_token COLLATE "C" <> soniq_get_step.claim_token COLLATE "C"
       OR r.claim_generation <> soniq_get_step.generation
       OR r.status <> 'processing'
       OR r.lease_expires_at IS NULL OR r.lease_expires_at <= pg_catalog.clock_timestamp() THEN
        RETURN QUERY SELECT false, false, NULL::jsonb;
        RETURN;
    END IF;
    RETURN QUERY
        SELECT true, true, s.result
          FROM {schema}.soniq_job_steps AS s
         WHERE s.job_id = r.id AND s.name = soniq_get_step.name;
    IF NOT FOUND THEN
        RETURN QUERY SELECT true, false, NULL::jsonb;
    END IF;
END
$fn$;

-- soniq_record_step --
-- Record step `name` (1 to 200 characters) of the exact live claim with
-- `result` (any JSON; SQL NULL is recorded as JSON null). True when
-- recorded; false when the fence does not hold or a cancel is requested.
-- A result whose JSON text is longer than max_bytes is refused, SQLSTATE
-- 54000 with HINT SONIQ_STEP_TOO_LARGE (max_bytes: 1 to 64 MiB, else
-- 22023 CONFIG); a name already recorded for the job, SQLSTATE 23505 with
-- HINT SONIQ_STEP_DUPLICATE (look it up first: soniq_get_step).
CREATE FUNCTION {schema}.soniq_record_step(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    name text, result jsonb, max_bytes integer DEFAULT 65536
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_size integer;
    v_cancel boolean;
    v_attempts integer;
BEGIN
    IF soniq_record_step.name IS NULL OR soniq_record_step.name = ''
       OR pg_catalog.length(soniq_record_step.name) > 200 THEN
        RAISE EXCEPTION 'a step name is a string of 1 to 200 characters'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF soniq_record_step.max_bytes IS NULL OR soniq_record_step.max_bytes < 1
       OR soniq_record_step.max_bytes > 67108864 THEN
        RAISE EXCEPTION 'max_bytes must be from 1 to 67108864'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    v_size := pg_catalog.octet_length(COALESCE(soniq_record_step.result, 'null'::jsonb)::text);
    IF v_size > soniq_record_step.max_bytes THEN
        RAISE EXCEPTION 'the step result is larger than max_bytes'
            USING ERRCODE = '54000', HINT = 'SONIQ_STEP_TOO_LARGE';
    END IF;
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_record_step.job_id, soniq_record_step.worker_id, soniq_record_step.generation,
        soniq_record_step.claim_token, soniq_record_step.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    -- The row is locked by this transaction: what it says holds to the COMMIT.
    SELECT j.cancel_requested, j.attempts INTO v_cancel, v_attempts
      FROM {schema}.soniq_jobs AS j
     WHERE j.id = soniq_record_step.job_id::uuid;
    IF v_cancel THEN
        RETURN false;
    END IF;
    INSERT INTO {schema}.soniq_job_steps AS s
           (job_id, name, result, size, attempt, generation, recorded_at)
    VALUES (soniq_record_step.job_id::uuid, soniq_record_step.name,
            COALESCE(soniq_record_step.result, 'null'::jsonb), v_size, v_attempts,
            soniq_record_step.generation, v_now)
    ON CONFLICT (job_id, name) DO NOTHING;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this step is already recorded for the job'
            USING ERRCODE = '23505', HINT = 'SONIQ_STEP_DUPLICATE';
    END IF;
    RETURN true;
END
$fn$;

-- soniq_job_steps_gone_v1 --
CREATE FUNCTION {schema}.soniq_job_steps_gone_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {schema}.soniq_job_steps) THEN
        RETURN NULL;  -- no steps at all: one probe of an empty table
    END IF;
    IF TG_TABLE_NAME = 'soniq_jobs' THEN
        DELETE FROM {schema}.soniq_job_steps AS s
         USING gone AS g
         WHERE s.job_id = g.id
           AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d WHERE d.id = g.id);
    ELSE
        DELETE FROM {schema}.soniq_job_steps AS s
         USING gone AS g
         WHERE s.job_id = g.id
           AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.id = g.id);
    END IF;
    RETURN NULL;
END
$fn$;

-- soniq_job_steps_job_gone --
CREATE TRIGGER soniq_job_steps_job_gone
    AFTER DELETE ON {schema}.soniq_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_job_steps_gone_v1();

-- soniq_job_steps_dead_letter_gone --
CREATE TRIGGER soniq_job_steps_dead_letter_gone
    AFTER DELETE ON {schema}.soniq_dead_letter_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_job_steps_gone_v1();

REVOKE ALL ON FUNCTION {schema}.soniq_job_steps_gone_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_get_step(text, text, bigint, text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_record_step(text, text, bigint, text, text, text, jsonb, integer) FROM PUBLIC;
