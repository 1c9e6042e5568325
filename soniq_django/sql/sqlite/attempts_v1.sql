-- soniq_django attempt history, version 1: the SQLite twin of
-- ../attempts_v1.sql (read that file for the rules), run by migration
-- 0020_attempts on SQLite; its reverse is attempts_v1.down.sql here. SQLite
-- has no statement triggers: a job's rows go with it row by row. Dates are
-- compared as Django stores them (ISO text, one format).

CREATE TRIGGER soniq_attempt_given_back AFTER UPDATE ON soniq_jobs
FOR EACH ROW
WHEN OLD.status = 'processing' AND NEW.status = 'processing'
     AND NEW.claim_generation = OLD.claim_generation AND NEW.attempts < OLD.attempts
BEGIN
    INSERT INTO soniq_job_attempts
        (job_id, attempt, generation, worker_id, claim_owner, claimed_at, ended_at, outcome)
    VALUES (OLD.id, OLD.attempts, OLD.claim_generation, OLD.worker_id, OLD.claim_owner,
            OLD.claimed_at, NEW.updated_at, 'deferred');
    DELETE FROM soniq_job_attempts
     WHERE job_id = OLD.id
       AND id <= (SELECT b.id FROM soniq_job_attempts AS b
                   WHERE b.job_id = OLD.id ORDER BY b.id DESC LIMIT 1 OFFSET 100);
END;

CREATE TRIGGER soniq_attempt_ended AFTER UPDATE ON soniq_jobs
FOR EACH ROW
WHEN OLD.status = 'processing'
     AND (NEW.status = 'queued'
          OR (NEW.status = 'processing' AND NEW.claim_generation <> OLD.claim_generation))
BEGIN
    UPDATE soniq_job_attempts
       SET ended_at = NEW.updated_at, error = substr(NEW.last_error, 1, 8192)
     WHERE NEW.status = 'queued' AND job_id = OLD.id AND generation = OLD.claim_generation
       AND outcome = 'deferred';
    INSERT INTO soniq_job_attempts
        (job_id, attempt, generation, worker_id, claim_owner, claimed_at, ended_at, outcome,
         dead_letter_reason, error)
    SELECT OLD.id, OLD.attempts, OLD.claim_generation, OLD.worker_id, OLD.claim_owner,
           OLD.claimed_at,
           CASE WHEN NEW.status = 'queued' THEN NEW.updated_at
                ELSE coalesce(NEW.claimed_at, NEW.updated_at) END,
           CASE WHEN NEW.status <> 'queued' THEN 'lapsed'
                WHEN OLD.lease_expires_at IS NOT NULL AND OLD.lease_expires_at <= NEW.updated_at
                    THEN 'lapsed'
                ELSE 'failed' END,
           NULL,
           CASE WHEN NEW.status = 'queued' THEN substr(NEW.last_error, 1, 8192) END
     WHERE NOT EXISTS (SELECT 1 FROM soniq_job_attempts AS a
                        WHERE a.job_id = OLD.id AND a.generation = OLD.claim_generation
                          AND a.outcome = 'deferred');
    DELETE FROM soniq_job_attempts
     WHERE job_id = OLD.id
       AND id <= (SELECT b.id FROM soniq_job_attempts AS b
                   WHERE b.job_id = OLD.id ORDER BY b.id DESC LIMIT 1 OFFSET 100);
END;

CREATE TRIGGER soniq_attempt_dead AFTER DELETE ON soniq_jobs
FOR EACH ROW
WHEN OLD.status = 'processing'
     AND EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                  WHERE d.id = OLD.id
                    AND (OLD.claimed_at IS NULL OR d.moved_to_dead_letter_at >= OLD.claimed_at))
BEGIN
    INSERT INTO soniq_job_attempts
        (job_id, attempt, generation, worker_id, claim_owner, claimed_at, ended_at, outcome,
         dead_letter_reason, error)
    SELECT OLD.id, OLD.attempts, OLD.claim_generation, OLD.worker_id, OLD.claim_owner,
           OLD.claimed_at, d.moved_to_dead_letter_at, 'dead', d.dead_letter_reason,
           substr(d.last_error, 1, 8192)
      FROM soniq_dead_letter_jobs AS d WHERE d.id = OLD.id;
    DELETE FROM soniq_job_attempts
     WHERE job_id = OLD.id
       AND id <= (SELECT b.id FROM soniq_job_attempts AS b
                   WHERE b.job_id = OLD.id ORDER BY b.id DESC LIMIT 1 OFFSET 100);
END;

CREATE TRIGGER soniq_attempts_job_gone AFTER DELETE ON soniq_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d WHERE d.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_attempts WHERE job_id = OLD.id;
END;

CREATE TRIGGER soniq_attempts_dead_letter_gone AFTER DELETE ON soniq_dead_letter_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_attempts WHERE job_id = OLD.id;
END;
