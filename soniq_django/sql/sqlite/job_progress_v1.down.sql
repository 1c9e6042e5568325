-- Reverse of job_progress_v1.sql (SQLite). Migration 0024 then drops soniq_job_progress.
DROP TRIGGER soniq_job_progress_dead_letter_gone;
DROP TRIGGER soniq_job_progress_job_gone;
