-- Reverse of workflows_v2.sql.
DROP TRIGGER soniq_workflow_dead_letter_gone ON {schema}.soniq_dead_letter_jobs;
DROP TRIGGER soniq_workflow_job_gone ON {schema}.soniq_jobs;
DROP FUNCTION {schema}.soniq_workflow_rows_gone_v1();
