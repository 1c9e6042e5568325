-- Reverse of job_trace_v1.sql. Migration 0021 then drops soniq_job_trace.
DROP TRIGGER soniq_job_trace_dead_letter_gone ON {schema}.soniq_dead_letter_jobs;
DROP TRIGGER soniq_job_trace_job_gone ON {schema}.soniq_jobs;
DROP FUNCTION {schema}.soniq_job_trace_gone_v1();
