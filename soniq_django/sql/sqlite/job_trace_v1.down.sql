-- Reverse of job_trace_v1.sql (SQLite).
DROP TRIGGER soniq_job_trace_dead_letter_gone;
DROP TRIGGER soniq_job_trace_job_gone;
