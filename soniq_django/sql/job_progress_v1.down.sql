-- Reverse of job_progress_v1.sql. Migration 0024 then drops soniq_job_progress.
DROP TRIGGER soniq_job_progress_dead_letter_gone ON {schema}.soniq_dead_letter_jobs;
DROP TRIGGER soniq_job_progress_job_gone ON {schema}.soniq_jobs;
DROP TRIGGER soniq_job_dead_lettered ON {schema}.soniq_dead_letter_jobs;
DROP TRIGGER soniq_job_finished ON {schema}.soniq_jobs;
DROP FUNCTION {schema}.soniq_set_progress(text, text, bigint, text, text, bigint, bigint, text);
DROP FUNCTION {schema}.soniq_job_progress_gone_v1();
DROP FUNCTION {schema}.soniq_job_finished_v1();
DROP TABLE {schema}.soniq_job_waiters;
