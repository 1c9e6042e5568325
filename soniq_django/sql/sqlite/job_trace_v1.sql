-- soniq_django trace contexts, version 1: the SQLite twin of
-- ../job_trace_v1.sql (read that file for the rules), run by migration
-- 0021_job_trace on SQLite; its reverse is job_trace_v1.down.sql here.
-- SQLite has no statement triggers: a job's row goes with it row by row.

CREATE TRIGGER soniq_job_trace_job_gone AFTER DELETE ON soniq_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d WHERE d.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_trace WHERE job_id = OLD.id;
END;

CREATE TRIGGER soniq_job_trace_dead_letter_gone AFTER DELETE ON soniq_dead_letter_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_trace WHERE job_id = OLD.id;
END;
