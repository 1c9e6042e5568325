-- Reverse of workflows_v2.sql (SQLite).
DROP TRIGGER soniq_workflow_dead_letter_gone;
DROP TRIGGER soniq_workflow_job_gone;
