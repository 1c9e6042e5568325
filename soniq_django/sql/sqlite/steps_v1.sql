-- soniq_django durable steps, version 1: the SQLite twin of ../steps_v1.sql's
-- purge (read that file for the rules), run by migration 0028_job_steps on
-- SQLite; its reverse is steps_v1.down.sql here. The lookup and the fenced
-- record are Python (soniq_django/steps/store.py). A job's steps go with it
-- row by row.

CREATE TRIGGER soniq_job_steps_job_gone AFTER DELETE ON soniq_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d WHERE d.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_steps WHERE job_id = OLD.id;
END;

CREATE TRIGGER soniq_job_steps_dead_letter_gone AFTER DELETE ON soniq_dead_letter_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_steps WHERE job_id = OLD.id;
END;
