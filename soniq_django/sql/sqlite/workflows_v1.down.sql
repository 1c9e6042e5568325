-- Reverse of workflows_v1.sql (SQLite).
DROP TRIGGER soniq_dependent_guard;
DROP TRIGGER soniq_dependency_gone;
DROP TRIGGER soniq_dependency_ended;
DROP TABLE soniq_workflow_settle;
