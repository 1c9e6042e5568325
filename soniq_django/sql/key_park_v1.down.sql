-- Reverse of key_park_v1.sql: the workflow triggers back on v1, then its own
-- triggers and functions. Migration 0032 then drops
-- soniq_dead_letter_jobs.concurrency_key.
DROP TRIGGER soniq_dependency_ended ON {schema}.soniq_jobs;
DROP TRIGGER soniq_dependency_gone ON {schema}.soniq_jobs;
CREATE TRIGGER soniq_dependency_ended
    AFTER UPDATE OF status ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND OLD.status IN ('queued', 'processing')
          AND NEW.status IN ('done', 'cancelled'))
    EXECUTE FUNCTION {schema}.soniq_dependency_ended_v1();
CREATE TRIGGER soniq_dependency_gone
    AFTER DELETE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.has_dependents AND OLD.status IN ('queued', 'processing'))
    EXECUTE FUNCTION {schema}.soniq_dependency_ended_v1();
DROP TRIGGER soniq_key_dead_letter ON {schema}.soniq_jobs;
DROP FUNCTION {schema}.soniq_enqueue_keyed_many(jsonb);
DROP FUNCTION {schema}.soniq_enqueue_keyed_after(text, integer, text, uuid[], text, jsonb, text,
    integer, timestamptz, integer, boolean, text, text, uuid, boolean, double precision);
DROP FUNCTION {schema}.soniq_dependency_ended_v2();
DROP FUNCTION {schema}.soniq_settle_dependents_v2(uuid, boolean, interval);
DROP FUNCTION {schema}.soniq_key_dead_letter_v1();
DROP FUNCTION {schema}.soniq_key_park_v1(uuid, timestamptz);
