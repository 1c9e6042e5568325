-- Reverse of steps_v1.sql. Migration 0028 then drops soniq_job_steps.
DROP TRIGGER soniq_job_steps_dead_letter_gone ON {schema}.soniq_dead_letter_jobs;
DROP TRIGGER soniq_job_steps_job_gone ON {schema}.soniq_jobs;
DROP FUNCTION {schema}.soniq_record_step(text, text, bigint, text, text, text, jsonb, integer);
DROP FUNCTION {schema}.soniq_get_step(text, text, bigint, text, text, text);
DROP FUNCTION {schema}.soniq_job_steps_gone_v1();
