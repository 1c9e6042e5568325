-- soniq_django trace contexts, version 1 (PostgreSQL). Loaded by migration
-- 0021_job_trace after it made the table soniq_job_trace; never edited once
-- released. Its reverse is job_trace_v1.down.sql. See
-- docs/decisions/0041-tracing-through-the-queue.md.
--
-- A job enqueued while an OpenTelemetry span was recording has one row in
-- soniq_job_trace (its traceparent and tracestate), written in the
-- enqueue's statement or transaction; most jobs have none. The row lives as
-- long as the job does in either job table -- a dead letter keeps it, so a
-- replayed job links to the enqueue that made it -- and these statement
-- triggers take it away when the job leaves both, whoever deleted it (the
-- purge, an operator, Soniq, a worker in another language): one call and
-- one join per DELETE statement, so a purge batch of a thousand rows costs
-- one. soniq_move_to_dead_letter_v1 inserts the dead letter before it
-- deletes the job, so the move keeps the row.

-- soniq_job_trace_gone_v1 --
CREATE FUNCTION {schema}.soniq_job_trace_gone_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF TG_TABLE_NAME = 'soniq_jobs' THEN
        DELETE FROM {schema}.soniq_job_trace AS t
         USING gone AS g
         WHERE t.job_id = g.id
           AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d WHERE d.id = g.id);
    ELSE
        DELETE FROM {schema}.soniq_job_trace AS t
         USING gone AS g
         WHERE t.job_id = g.id
           AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.id = g.id);
    END IF;
    RETURN NULL;
END
$fn$;

-- soniq_job_trace_job_gone --
CREATE TRIGGER soniq_job_trace_job_gone
    AFTER DELETE ON {schema}.soniq_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_job_trace_gone_v1();

-- soniq_job_trace_dead_letter_gone --
CREATE TRIGGER soniq_job_trace_dead_letter_gone
    AFTER DELETE ON {schema}.soniq_dead_letter_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_job_trace_gone_v1();

REVOKE ALL ON FUNCTION {schema}.soniq_job_trace_gone_v1() FROM PUBLIC;
