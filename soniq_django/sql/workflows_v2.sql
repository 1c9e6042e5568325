-- soniq_django workflows, version 2 (PostgreSQL): a job's workflow rows go
-- with it. Loaded by migration 0026_workflow_purge; never edited once
-- released. Its reverse is workflows_v2.down.sql; the SQLite twin is
-- sqlite/workflows_v2.sql. See docs/decisions/0044-workflows.md.
--
-- When jobs are deleted -- housekeeping's purge of expired rows, the purge of
-- old dead letters, an operator's DELETE -- the rows workflows_v1.sql and
-- soniq_enqueue_after keep about them go too, as soniq_job_attempts',
-- soniq_job_trace's and soniq_job_progress' do: one statement trigger per job
-- table, one call per DELETE statement, reading the statement's deleted rows
-- (its transition table). An id still in the other job table (a move to the
-- dead letters, a replay back) is not gone. For the ids that are gone:
--
-- * soniq_job_waits: the job's counter row (a waiting job deleted unfinished).
-- * soniq_job_dependencies: an edge goes when neither of its ends is in
--   either job table any more. While one end stays, so does the edge: a
--   dependent still waiting needs it counted, and a job's admin page links
--   its dependencies and dependents both ways (a gone end shows as purged).
-- * soniq_batches and soniq_batch_members: a batch and its member rows go
--   together, once its callback (if any) and every member are gone; until
--   then the batch keeps all its members, so its progress and
--   current_job().batch() still count every one of them.
--
-- The settlement of dependents (workflows_v1.sql's row triggers) runs first:
-- PostgreSQL fires a statement's AFTER ROW triggers before its AFTER
-- STATEMENT triggers. A deployment that never used workflows pays two index
-- probes of empty tables per DELETE statement, not per row.

-- soniq_workflow_rows_gone_v1 --
CREATE FUNCTION {schema}.soniq_workflow_rows_gone_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_gone uuid[];
    v_batches uuid[];
BEGIN
    IF NOT EXISTS (SELECT 1 FROM {schema}.soniq_job_dependencies)
       AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_batches) THEN
        RETURN NULL;  -- no workflow rows at all
    END IF;
    IF TG_TABLE_NAME = 'soniq_jobs' THEN
        v_gone := ARRAY(
            SELECT DISTINCT g.id FROM gone AS g
             WHERE NOT EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d
                                WHERE d.id = g.id)
               AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.id = g.id));
    ELSE
        v_gone := ARRAY(
            SELECT DISTINCT g.id FROM gone AS g
             WHERE NOT EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.id = g.id)
               AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d
                                WHERE d.id = g.id));
    END IF;
    IF pg_catalog.cardinality(v_gone) = 0 THEN
        RETURN NULL;
    END IF;

    DELETE FROM {schema}.soniq_job_waits AS w WHERE w.job_id = ANY (v_gone);

    -- Edges whose two ends are gone. Two transactions that delete the two
    -- ends at once would each see the other end still there (each its own
    -- snapshot) and keep the edge: so the edges are locked first (id order),
    -- and the checks run in a later statement -- a new snapshot under READ
    -- COMMITTED -- which sees the other deletion once it has committed.
    PERFORM 1 FROM {schema}.soniq_job_dependencies AS e
     WHERE e.job_id = ANY (v_gone) OR e.depends_on = ANY (v_gone)
     ORDER BY e.id FOR UPDATE;
    DELETE FROM {schema}.soniq_job_dependencies AS e
     WHERE (e.job_id = ANY (v_gone) OR e.depends_on = ANY (v_gone))
       AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j
                        WHERE j.id IN (e.job_id, e.depends_on))
       AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d
                        WHERE d.id IN (e.job_id, e.depends_on));

    -- Batches with nothing left: their members' rows, then the batch (locked
    -- first, as the edges are).
    v_batches := ARRAY(
        SELECT b.id FROM {schema}.soniq_batches AS b WHERE b.callback_id = ANY (v_gone)
        UNION
        SELECT m.batch_id FROM {schema}.soniq_batch_members AS m WHERE m.job_id = ANY (v_gone));
    IF pg_catalog.cardinality(v_batches) = 0 THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM {schema}.soniq_batches AS b WHERE b.id = ANY (v_batches)
     ORDER BY b.id FOR UPDATE;
    v_batches := ARRAY(
        SELECT b.id FROM {schema}.soniq_batches AS b
         WHERE b.id = ANY (v_batches)
           AND (b.callback_id IS NULL
                OR (NOT EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j
                                 WHERE j.id = b.callback_id)
                    AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d
                                     WHERE d.id = b.callback_id)))
           AND NOT EXISTS (
                SELECT 1 FROM {schema}.soniq_batch_members AS m
                 WHERE m.batch_id = b.id
                   AND (EXISTS (SELECT 1 FROM {schema}.soniq_jobs AS j WHERE j.id = m.job_id)
                        OR EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d
                                    WHERE d.id = m.job_id))));
    DELETE FROM {schema}.soniq_batch_members AS m WHERE m.batch_id = ANY (v_batches);
    DELETE FROM {schema}.soniq_batches AS b WHERE b.id = ANY (v_batches);
    RETURN NULL;
END
$fn$;

-- soniq_workflow_job_gone --
CREATE TRIGGER soniq_workflow_job_gone
    AFTER DELETE ON {schema}.soniq_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_workflow_rows_gone_v1();

-- soniq_workflow_dead_letter_gone --
CREATE TRIGGER soniq_workflow_dead_letter_gone
    AFTER DELETE ON {schema}.soniq_dead_letter_jobs
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT
    EXECUTE FUNCTION {schema}.soniq_workflow_rows_gone_v1();

REVOKE ALL ON FUNCTION {schema}.soniq_workflow_rows_gone_v1() FROM PUBLIC;
