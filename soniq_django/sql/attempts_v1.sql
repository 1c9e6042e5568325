-- soniq_django attempt history, version 1 (PostgreSQL). Loaded by migration
-- 0020_attempts after it added soniq_jobs.claimed_at and the table
-- soniq_job_attempts; never edited once released. Its reverse is
-- attempts_v1.down.sql. See docs/decisions/0034-attempt-history.md.
--
-- One row per attempt that ended without finishing its job, written by a
-- trigger in the transaction of the write that ended it, whoever wrote it:
--
-- * given back (soniq_defer lowers attempts while the job is processing,
--   then puts it back in the queue): "deferred", recorded at the first
--   write and given its error and end by the second;
-- * back in the queue (status processing -> queued) otherwise: "lapsed"
--   when its lease had ended before the write (only a reaper writes then:
--   every fenced write checks the lease is live), else "failed";
-- * claimed again while still processing (a new generation): "lapsed";
-- * moved to the dead letters while processing: "dead", with the dead
--   letter's reason and error (soniq_move_to_dead_letter_v1 inserts the
--   dead letter, then deletes the job, in one transaction).
--
-- Attempts that end a job (done, cancelled) write nothing: the job's row
-- keeps that attempt (claimed_at, worker_id, claim_generation, updated_at),
-- so the usual life of a job -- one attempt that succeeds -- costs nothing
-- here: the WHEN clauses below are checked, no function is called. A job
-- keeps its newest 100 rows (JobAttempt.KEPT_PER_JOB), and its rows go
-- with it: the statement trigger below deletes them when the job leaves
-- soniq_jobs for anywhere but the dead letters, and when its dead letter
-- is deleted while the job is not back in soniq_jobs.

-- soniq_attempt_ended_v1 --
CREATE FUNCTION {schema}.soniq_attempt_ended_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_outcome text;
    v_error text;
    v_reason text;
    v_ended timestamptz;
BEGIN
    IF TG_OP = 'DELETE' THEN
        -- The dead letter this attempt ended in (a replayed job's older one
        -- was moved before this claim). None: the row was deleted outright,
        -- and the statement trigger below takes the job's history with it.
        SELECT 'dead', d.last_error, d.dead_letter_reason, d.moved_to_dead_letter_at
          INTO v_outcome, v_error, v_reason, v_ended
          FROM {schema}.soniq_dead_letter_jobs AS d
         WHERE d.id = OLD.id
           AND (OLD.claimed_at IS NULL OR d.moved_to_dead_letter_at >= OLD.claimed_at);
        IF NOT FOUND THEN
            RETURN NULL;
        END IF;
    ELSIF NEW.status = 'processing' AND NEW.claim_generation = OLD.claim_generation THEN
        -- A deferral's first write: the attempt is given back (the WHEN
        -- clause admits this only when attempts went down).
        v_outcome := 'deferred';
        v_ended := coalesce(NEW.updated_at, pg_catalog.clock_timestamp());
        v_error := NULL;
    ELSIF NEW.status = 'queued' THEN
        v_ended := coalesce(NEW.updated_at, pg_catalog.clock_timestamp());
        v_error := NEW.last_error;
        -- A deferral's second write completes the row its first one made.
        UPDATE {schema}.soniq_job_attempts AS a
           SET ended_at = v_ended, error = pg_catalog.left(v_error, 8192)
         WHERE a.job_id = OLD.id AND a.generation = OLD.claim_generation
           AND a.outcome = 'deferred';
        IF FOUND THEN
            RETURN NULL;
        END IF;
        IF OLD.lease_expires_at IS NOT NULL AND OLD.lease_expires_at <= v_ended THEN
            v_outcome := 'lapsed';
        ELSE
            v_outcome := 'failed';
        END IF;
    ELSE  -- claimed again while processing: the earlier claim's lease had lapsed
        v_outcome := 'lapsed';
        v_ended := coalesce(NEW.claimed_at, NEW.updated_at, pg_catalog.clock_timestamp());
    END IF;
    INSERT INTO {schema}.soniq_job_attempts
        (job_id, attempt, generation, worker_id, claim_owner, claimed_at, ended_at, outcome,
         dead_letter_reason, error)
    VALUES (OLD.id, OLD.attempts, OLD.claim_generation, OLD.worker_id, OLD.claim_owner,
            OLD.claimed_at, v_ended, v_outcome, v_reason, pg_catalog.left(v_error, 8192));
    -- The newest 100 rows of a job are kept (JobAttempt.KEPT_PER_JOB).
    DELETE FROM {schema}.soniq_job_attempts AS a
     WHERE a.job_id = OLD.id
       AND a.id <= (SELECT b.id FROM {schema}.soniq_job_attempts AS b
                     WHERE b.job_id = OLD.id ORDER BY b.id DESC OFFSET 100 LIMIT 1);
    RETURN NULL;
END
$fn$;

-- soniq_attempts_gone_v1 --
-- A statement trigger: one call per DELETE statement, whatever its size (a
-- purge of a thousand rows is one call and one join).
CREATE FUNCTION {schema}.soniq_attempts_gone_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF TG_TABLE_NAME = 'soniq_jobs' THEN
        DELETE FROM {schema}.soniq_job_attempts AS a
         USING gone AS g
         WHERE a.job_id = g.id
           AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d WHERE d.id = g.id);
    ELSE
        DELETE FROM {schema}.soniq_job_attempts AS a
         USING gone AS g
         WHERE a.job_id = g.id
           AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.id = g.id);
    END IF;
    RETURN NULL;
END
$fn$;

-- soniq_attempt_ended --
CREATE TRIGGER soniq_attempt_ended
    AFTER UPDATE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.status = 'processing'
          AND (NEW.status = 'queued'
               OR (NEW.status = 'processing'
                   AND (NEW.claim_generation <> OLD.claim_generation
                        OR NEW.attempts < OLD.attempts))))
    EXECUTE FUNCTION {schema}.soniq_attempt_ended_v1();

-- soniq_attempt_dead --
CREATE TRIGGER soniq_attempt_dead
    AFTER DELETE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.status = 'processing')
    EXECUTE FUNCTION {schema}.soniq_attempt_ended_v1();

-- soniq_attempts_job_gone --
CREATE TRIGGER soniq_attempts_job_gone
    AFTER DELETE ON {schema}.soniq_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_attempts_gone_v1();

-- soniq_attempts_dead_letter_gone --
CREATE TRIGGER soniq_attempts_dead_letter_gone
    AFTER DELETE ON {schema}.soniq_dead_letter_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_attempts_gone_v1();

REVOKE ALL ON FUNCTION {schema}.soniq_attempt_ended_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_attempts_gone_v1() FROM PUBLIC;
