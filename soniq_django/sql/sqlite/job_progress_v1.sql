-- soniq_django progress, version 1: the SQLite twin of ../job_progress_v1.sql
-- (read that file for the rules), run by migration 0024_job_progress on
-- SQLite; its reverse is job_progress_v1.down.sql here. SQLite has no
-- LISTEN/NOTIFY: a waiter polls, so there is no waiters table and no
-- trigger on a job's end. A job's progress row goes with it row by row.

CREATE TRIGGER soniq_job_progress_job_gone AFTER DELETE ON soniq_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d WHERE d.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_progress WHERE job_id = OLD.id;
END;

CREATE TRIGGER soniq_job_progress_dead_letter_gone AFTER DELETE ON soniq_dead_letter_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_progress WHERE job_id = OLD.id;
END;
