-- Reverse of workflows_v1.sql: its triggers, then its functions.
DROP TRIGGER soniq_dependent_guard ON {schema}.soniq_jobs;
DROP TRIGGER soniq_dependency_gone ON {schema}.soniq_jobs;
DROP TRIGGER soniq_dependency_ended ON {schema}.soniq_jobs;
DROP FUNCTION {schema}.soniq_dependent_guard_v1();
DROP FUNCTION {schema}.soniq_dependency_ended_v1();
DROP FUNCTION {schema}.soniq_settle_dependents_v1(uuid, boolean, interval);
