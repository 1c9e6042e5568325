-- Reverse of attempts_v1.sql. Migration 0020 then drops soniq_job_attempts
-- and soniq_jobs.claimed_at.
DROP TRIGGER soniq_attempts_dead_letter_gone ON {schema}.soniq_dead_letter_jobs;
DROP TRIGGER soniq_attempts_job_gone ON {schema}.soniq_jobs;
DROP TRIGGER soniq_attempt_dead ON {schema}.soniq_jobs;
DROP TRIGGER soniq_attempt_ended ON {schema}.soniq_jobs;
DROP FUNCTION {schema}.soniq_attempts_gone_v1();
DROP FUNCTION {schema}.soniq_attempt_ended_v1();
