-- Reverse of steps_v1.sql (SQLite). Migration 0028 then drops soniq_job_steps.
DROP TRIGGER soniq_job_steps_dead_letter_gone;
DROP TRIGGER soniq_job_steps_job_gone;
