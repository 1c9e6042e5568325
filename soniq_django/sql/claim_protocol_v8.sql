-- soniq_django claim protocol, version 8 (PostgreSQL only): bounded waits.
--
-- Versions 1 to 7 stay as they are; this file gives functions new bodies
-- (same names, signatures and grants unless a block says otherwise) and adds
-- the functions of slots held by timed-out handlers (soniq_queue_holds).
-- Loaded by migration 0018_claim_protocol_v8; never edited once released. The
-- reverse (claim_protocol_v8.down.sql, then the released bodies the migration
-- names) restores version 7's behaviour.
--
-- See docs/decisions/0029-claim-protocol-v8.md.
SELECT 1;

-- Slots held by handlers that run on (helper `holds`, docs/decisions/0033) ----
--
-- A concurrency limit is about the service behind the queue: it counts
-- handlers running, not rows. A plain function past its time limit cannot be
-- stopped; its claim ends at the deadline (soniq_fail) but the function runs
-- on. The worker calls soniq_hold_slot in the transaction of that soniq_fail,
-- before it, so the slot passes from the processing row to a row of
-- soniq_queue_holds without a gap; soniq_renew_holds keeps the holds of the
-- handlers still running alive (each beat), and soniq_release_hold deletes a
-- hold once its handler returned. A worker that dies stops renewing: its
-- holds lapse with their lease, as its claims do. A claim counts a queue's
-- running jobs as its processing rows plus its live holds
-- (lease_expires_at after the claim's time).

-- soniq_hold_slot --
-- Keep the queue slot of the exact live claim for its handler, which runs on
-- after the claim ends: one hold row (job_id, generation, queue, worker_id),
-- its lease ending lease_seconds from now. Call it in the transaction that
-- ends the claim (soniq_fail of a timeout), before that write: it locks the
-- row and checks the whole fence after the lock, as every fenced write does.
-- True when held (again: its lease renewed); false, nothing written, when
-- the fence does not own the job (missing, stale, expired, finished). Also
-- deletes the queue's lapsed holds (their workers stopped renewing them).
CREATE FUNCTION {schema}.soniq_hold_slot(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    lease_seconds double precision DEFAULT 30
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM {schema}.soniq_check_seconds_v1(lease_seconds, 'lease_seconds', false);
    -- Locks the row, then reads the clock: the whole fence is compared after the lock.
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_hold_slot.job_id, soniq_hold_slot.worker_id, soniq_hold_slot.generation,
        soniq_hold_slot.claim_token, soniq_hold_slot.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    DELETE FROM {schema}.soniq_queue_holds AS h
     WHERE h.queue = soniq_hold_slot.queue AND h.lease_expires_at <= v_now;
    INSERT INTO {schema}.soniq_queue_holds AS h
           (job_id, generation, queue, claim_owner, lease_expires_at, created_at)
    VALUES (soniq_hold_slot.job_id::uuid, soniq_hold_slot.generation, soniq_hold_slot.queue,
            soniq_hold_slot.worker_id,
            v_now + pg_catalog.make_interval(secs => soniq_hold_slot.lease_seconds), v_now)
    ON CONFLICT ON CONSTRAINT soniq_queue_holds_claim_uniq
    DO UPDATE SET lease_expires_at = EXCLUDED.lease_expires_at;
    RETURN true;
END
$fn$;

-- soniq_release_hold --
-- The handler of a held slot returned: delete the hold of that claim (job_id
-- and generation) made by worker_id. True when a hold was deleted; false when
-- there was none (never taken, released before, or another worker's).
-- Touches no job row: the claim ended when the hold was taken.
CREATE FUNCTION {schema}.soniq_release_hold(
    job_id text, worker_id text, generation bigint
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(soniq_release_hold.worker_id, 'worker_id');
    IF soniq_release_hold.job_id IS NULL OR soniq_release_hold.generation IS NULL
       OR soniq_release_hold.generation < 1 THEN
        RAISE EXCEPTION 'invalid hold' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    DELETE FROM {schema}.soniq_queue_holds AS h
     WHERE h.job_id = soniq_release_hold.job_id::uuid
       AND h.generation = soniq_release_hold.generation
       AND h.claim_owner COLLATE "C" = soniq_release_hold.worker_id COLLATE "C";
    RETURN FOUND;
END
$fn$;

-- soniq_renew_holds --
-- Renew worker_id's live holds of the claims named (job_ids[i] with
-- generations[i]; 1 to 1000 of them): each lease ends lease_seconds from now.
-- A lapsed hold is not renewed (its slot may have been taken since). Returns
-- how many were renewed. Named one by one rather than every hold of the
-- worker, so that a hold whose release failed is never kept alive: it lapses.
CREATE FUNCTION {schema}.soniq_renew_holds(
    worker_id text, job_ids text[], generations bigint[],
    lease_seconds double precision DEFAULT 30
) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_count integer;
    v_size integer := pg_catalog.cardinality(soniq_renew_holds.job_ids);
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(soniq_renew_holds.worker_id, 'worker_id');
    PERFORM {schema}.soniq_check_seconds_v1(lease_seconds, 'lease_seconds', false);
    IF v_size IS NULL OR v_size < 1 OR v_size > 1000
       OR pg_catalog.array_ndims(soniq_renew_holds.job_ids) <> 1
       OR pg_catalog.cardinality(soniq_renew_holds.generations) IS DISTINCT FROM v_size
       OR pg_catalog.array_ndims(soniq_renew_holds.generations) <> 1 THEN
        RAISE EXCEPTION 'job_ids and generations must hold 1 to 1000 claims each, in pairs'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    v_now := pg_catalog.clock_timestamp();
    UPDATE {schema}.soniq_queue_holds AS h
       SET lease_expires_at = v_now + pg_catalog.make_interval(
               secs => soniq_renew_holds.lease_seconds)
      FROM ROWS FROM (pg_catalog.unnest(soniq_renew_holds.job_ids),
                      pg_catalog.unnest(soniq_renew_holds.generations)) AS c(job_id, generation)
     WHERE h.job_id = c.job_id::uuid AND h.generation = c.generation
       AND h.claim_owner COLLATE "C" = soniq_renew_holds.worker_id COLLATE "C"
       AND h.lease_expires_at > v_now;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- soniq_defer (version 8 body; same signature) --
-- Version 4's deferral (claim_protocol_v4.sql says what it answers), and a
-- deferral is not a start: the start this claim recorded in
-- soniq_queue_starts (a rate-limited queue's window) is taken back in the
-- same transaction. The claim wrote its time both there (started_at) and in
-- the row (updated_at); a renewal of the lease moves updated_at, and then
-- the start is left to age out of the window as before. One row is deleted
-- (a batch claim's starts share a time); SKIP LOCKED lets two deferrals of
-- one batch take back one start each instead of waiting for each other.
CREATE OR REPLACE FUNCTION {schema}.soniq_defer(
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
    r record;
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
    SELECT j.cancel_requested, j.queue, j.updated_at INTO r
      FROM {schema}.soniq_jobs AS j WHERE j.id = soniq_defer.job_id::uuid;
    IF r.cancel_requested THEN  -- the worker must acknowledge the cancel instead
        RETURN false;
    END IF;
    DELETE FROM {schema}.soniq_queue_starts AS t
     WHERE t.ctid = (SELECT s.ctid FROM {schema}.soniq_queue_starts AS s
                      WHERE s.queue = r.queue AND s.started_at = r.updated_at
                      LIMIT 1
                        FOR UPDATE SKIP LOCKED);
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

REVOKE ALL ON FUNCTION {schema}.soniq_hold_slot(text, text, bigint, text, text, double precision) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_release_hold(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_renew_holds(text, text[], bigint[], double precision) FROM PUBLIC;
