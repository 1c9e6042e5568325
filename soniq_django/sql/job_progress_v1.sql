-- soniq_django waiting and progress, version 1 (PostgreSQL). Loaded by
-- migration 0024_job_progress after it made the table soniq_job_progress;
-- never edited once released. Its reverse is job_progress_v1.down.sql. See
-- docs/decisions/0043-waiting-and-progress.md and docs/workflows.md.
--
-- Waiting (soniq_django.wait_for_job). A waiter puts a row in
-- soniq_job_waiters (committed, before it reads the job), LISTENs on the
-- job's own channel, soniq_job_<the id's 32 hex digits>, then reads the job.
-- The triggers below send one NOTIFY on that channel when the job finishes
-- -- done or cancelled (an UPDATE of status), or dead-lettered (the INSERT
-- of its dead letter) -- but only when a waiter's row names the job. So a
-- completion nobody waits for pays the WHEN clause (no call for any other
-- UPDATE) and one index probe of a table that is usually empty: no NOTIFY,
-- and none of the commit-time lock a NOTIFY takes. Whoever finishes the job
-- -- soniq_django's worker, an operator, a worker in another language
-- calling the claim protocol -- the trigger sees it. The table is UNLOGGED:
-- its rows live as long as one wait (a crash that empties it ends the
-- waiters' connections too, and they read the job again as they reconnect);
-- a waiter deletes its own row, and housekeeping the rows of waiters that
-- died (expires_at past).
--
-- Progress (current_job().set_progress). One row per job in
-- soniq_job_progress, written by soniq_set_progress under the claim's full
-- fence (the job's row locked, the lease checked against clock_timestamp()
-- after the lock, as every fenced write of the claim protocol): a lapsed
-- claim writes nothing. The row stays with the job while it is in either
-- job table and goes with it, as soniq_job_trace's does: statement triggers,
-- one call and one join per DELETE statement.

CREATE UNLOGGED TABLE {schema}.soniq_job_waiters (
    job_id uuid NOT NULL,
    waiter uuid NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (job_id, waiter)
);

-- soniq_job_finished_v1 --
CREATE FUNCTION {schema}.soniq_job_finished_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_status text := 'dead_letter';
BEGIN
    IF EXISTS (SELECT 1 FROM {schema}.soniq_job_waiters AS w WHERE w.job_id = NEW.id) THEN
        IF TG_TABLE_NAME = 'soniq_jobs' THEN  -- (a dead letter has no status column)
            v_status := NEW.status;
        END IF;
        PERFORM pg_catalog.pg_notify(
            'soniq_job_' || pg_catalog.replace(NEW.id::text, '-', ''), v_status);
    END IF;
    RETURN NULL;
END
$fn$;

-- soniq_job_progress_gone_v1 --
CREATE FUNCTION {schema}.soniq_job_progress_gone_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF TG_TABLE_NAME = 'soniq_jobs' THEN
        DELETE FROM {schema}.soniq_job_progress AS p
         USING gone AS g
         WHERE p.job_id = g.id
           AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d WHERE d.id = g.id);
    ELSE
        DELETE FROM {schema}.soniq_job_progress AS p
         USING gone AS g
         WHERE p.job_id = g.id
           AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.id = g.id);
    END IF;
    RETURN NULL;
END
$fn$;

-- soniq_set_progress --
-- Record the progress of the exact live claim: done (>= 0), total (NULL or
-- >= 0), note (NULL or at most 1000 characters). True when written; false
-- when the fence no longer holds (missing, stale, expired or terminal).
-- Allowed while a cancel is requested.
CREATE FUNCTION {schema}.soniq_set_progress(
    job_id text, worker_id text, generation bigint, claim_token text, queue text,
    done bigint, total bigint DEFAULT NULL, note text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
BEGIN
    IF soniq_set_progress.done IS NULL OR soniq_set_progress.done < 0
       OR soniq_set_progress.total < 0 THEN
        RAISE EXCEPTION 'progress counts must be integers >= 0'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF pg_catalog.length(soniq_set_progress.note) > 1000 THEN
        RAISE EXCEPTION 'a progress note is at most 1000 characters'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    v_now := {schema}.soniq_lock_fence_v1(
        soniq_set_progress.job_id, soniq_set_progress.worker_id, soniq_set_progress.generation,
        soniq_set_progress.claim_token, soniq_set_progress.queue);
    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    INSERT INTO {schema}.soniq_job_progress AS p (job_id, done, total, note, updated_at)
    VALUES (soniq_set_progress.job_id::uuid, soniq_set_progress.done, soniq_set_progress.total,
            soniq_set_progress.note, v_now)
    ON CONFLICT (job_id) DO UPDATE
       SET done = EXCLUDED.done, total = EXCLUDED.total, note = EXCLUDED.note,
           updated_at = EXCLUDED.updated_at;
    RETURN true;
END
$fn$;

-- soniq_job_finished --
CREATE TRIGGER soniq_job_finished
    AFTER UPDATE OF status ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (NEW.status IN ('done', 'cancelled') AND OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION {schema}.soniq_job_finished_v1();

-- soniq_job_dead_lettered --
CREATE TRIGGER soniq_job_dead_lettered
    AFTER INSERT ON {schema}.soniq_dead_letter_jobs
    FOR EACH ROW
    EXECUTE FUNCTION {schema}.soniq_job_finished_v1();

-- soniq_job_progress_job_gone --
CREATE TRIGGER soniq_job_progress_job_gone
    AFTER DELETE ON {schema}.soniq_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_job_progress_gone_v1();

-- soniq_job_progress_dead_letter_gone --
CREATE TRIGGER soniq_job_progress_dead_letter_gone
    AFTER DELETE ON {schema}.soniq_dead_letter_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_job_progress_gone_v1();

REVOKE ALL ON FUNCTION {schema}.soniq_job_finished_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_job_progress_gone_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_set_progress(text, text, bigint, text, text, bigint, bigint, text) FROM PUBLIC;
