-- soniq_django workflows, version 1: the SQLite twin of ../workflows_v1.sql
-- (read that file for the rules), run by migration 0025_workflows on SQLite;
-- its reverse is workflows_v1.down.sql here. Never edited once released.
--
-- SQLite runs one writer at a time, so no lock orders two completions: the
-- work list of the PostgreSQL function becomes set-based statements. The
-- dependents a failure cancels, down the graph, are found at once by a
-- recursive query and kept in soniq_workflow_settle (empty between writes)
-- with the job that ended each -- the trigger's own scratch table: a trigger
-- cannot use a TEMP table -- and every statement after reads them there. A
-- trigger does not fire itself here (recursive_triggers is off by default);
-- with it on, the WHEN clauses' test of the scratch table keeps the writes
-- below from settling anything twice. Dates are compared as Django stores
-- them (UTC text); the far-off time of a waiting job is '9999-01-01 00:00:00'.

CREATE TABLE soniq_workflow_settle (
    job_id char(32) NOT NULL PRIMARY KEY,
    cause char(32) NULL,
    failed integer NOT NULL
);

CREATE TRIGGER soniq_dependency_ended AFTER UPDATE OF status ON soniq_jobs
FOR EACH ROW
WHEN NEW.has_dependents AND OLD.status IN ('queued', 'processing')
     AND NEW.status IN ('done', 'cancelled')
     AND NOT EXISTS (SELECT 1 FROM soniq_workflow_settle)
BEGIN
    INSERT INTO soniq_workflow_settle (job_id, cause, failed) VALUES (NEW.id, NULL, (NEW.status <> 'done'));
    INSERT INTO soniq_workflow_settle (job_id, cause, failed)
    SELECT f.id, min(f.cause), 1
      FROM (WITH RECURSIVE f(id, cause) AS (
                SELECT d.job_id, d.depends_on FROM soniq_job_dependencies AS d
                 WHERE (NEW.status <> 'done') AND d.depends_on = NEW.id AND NOT d.any_outcome
                   AND d.state = 'waiting'
                   AND EXISTS (SELECT 1 FROM soniq_job_waits AS w WHERE w.job_id = d.job_id)
                   AND EXISTS (SELECT 1 FROM soniq_jobs AS j
                                WHERE j.id = d.job_id AND j.status = 'queued')
                UNION
                SELECT d.job_id, d.depends_on FROM soniq_job_dependencies AS d
                  JOIN f ON d.depends_on = f.id
                 WHERE NOT d.any_outcome AND d.state = 'waiting'
                   AND EXISTS (SELECT 1 FROM soniq_job_waits AS w WHERE w.job_id = d.job_id)
                   AND EXISTS (SELECT 1 FROM soniq_jobs AS j
                                WHERE j.id = d.job_id AND j.status = 'queued'))
            SELECT f.id, f.cause FROM f) AS f
     WHERE f.id <> NEW.id
     GROUP BY f.id;
    UPDATE soniq_jobs
       SET status = 'cancelled',
           last_error = (SELECT 'dependency_failed:' || lower(substr(s.cause, 1, 8) || '-'
                                || substr(s.cause, 9, 4) || '-' || substr(s.cause, 13, 4) || '-'
                                || substr(s.cause, 17, 4) || '-' || substr(s.cause, 21))
                           FROM soniq_workflow_settle AS s WHERE s.job_id = soniq_jobs.id),
           expires_at = coalesce(NEW.expires_at, strftime('%Y-%m-%d %H:%M:%f', 'now', '+300 seconds')),
           updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
     WHERE id IN (SELECT s.job_id FROM soniq_workflow_settle AS s WHERE s.cause IS NOT NULL)
       AND status = 'queued';
    UPDATE soniq_job_waits
       SET pending = pending - (SELECT count(*) FROM soniq_job_dependencies AS e
                                 WHERE e.job_id = soniq_job_waits.job_id AND e.state = 'waiting'
                                   AND e.depends_on IN (SELECT s.job_id
                                                          FROM soniq_workflow_settle AS s))
     WHERE job_id IN (SELECT e.job_id FROM soniq_job_dependencies AS e
                       WHERE e.state = 'waiting'
                         AND e.depends_on IN (SELECT s.job_id FROM soniq_workflow_settle AS s))
       AND job_id NOT IN (SELECT s.job_id FROM soniq_workflow_settle AS s);
    UPDATE soniq_job_dependencies
       SET state = CASE WHEN (SELECT s.failed FROM soniq_workflow_settle AS s
                               WHERE s.job_id = soniq_job_dependencies.depends_on)
                        THEN 'failed' ELSE 'done' END
     WHERE state = 'waiting'
       AND depends_on IN (SELECT s.job_id FROM soniq_workflow_settle AS s);
    DELETE FROM soniq_job_waits
     WHERE job_id IN (SELECT s.job_id FROM soniq_workflow_settle AS s WHERE s.cause IS NOT NULL);
    UPDATE soniq_jobs
       SET scheduled_at = (SELECT w.run_at FROM soniq_job_waits AS w
                            WHERE w.job_id = soniq_jobs.id),
           updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
     WHERE id IN (SELECT w.job_id FROM soniq_job_waits AS w WHERE w.pending <= 0)
       AND status = 'queued';
    DELETE FROM soniq_job_waits WHERE pending <= 0;
    DELETE FROM soniq_workflow_settle;
END;

CREATE TRIGGER soniq_dependency_gone AFTER DELETE ON soniq_jobs
FOR EACH ROW
WHEN OLD.has_dependents AND OLD.status IN ('queued', 'processing')
     AND NOT EXISTS (SELECT 1 FROM soniq_workflow_settle)
BEGIN
    INSERT INTO soniq_workflow_settle (job_id, cause, failed) VALUES (OLD.id, NULL, 1);
    INSERT INTO soniq_workflow_settle (job_id, cause, failed)
    SELECT f.id, min(f.cause), 1
      FROM (WITH RECURSIVE f(id, cause) AS (
                SELECT d.job_id, d.depends_on FROM soniq_job_dependencies AS d
                 WHERE 1 AND d.depends_on = OLD.id AND NOT d.any_outcome
                   AND d.state = 'waiting'
                   AND EXISTS (SELECT 1 FROM soniq_job_waits AS w WHERE w.job_id = d.job_id)
                   AND EXISTS (SELECT 1 FROM soniq_jobs AS j
                                WHERE j.id = d.job_id AND j.status = 'queued')
                UNION
                SELECT d.job_id, d.depends_on FROM soniq_job_dependencies AS d
                  JOIN f ON d.depends_on = f.id
                 WHERE NOT d.any_outcome AND d.state = 'waiting'
                   AND EXISTS (SELECT 1 FROM soniq_job_waits AS w WHERE w.job_id = d.job_id)
                   AND EXISTS (SELECT 1 FROM soniq_jobs AS j
                                WHERE j.id = d.job_id AND j.status = 'queued'))
            SELECT f.id, f.cause FROM f) AS f
     WHERE f.id <> OLD.id
     GROUP BY f.id;
    UPDATE soniq_jobs
       SET status = 'cancelled',
           last_error = (SELECT 'dependency_failed:' || lower(substr(s.cause, 1, 8) || '-'
                                || substr(s.cause, 9, 4) || '-' || substr(s.cause, 13, 4) || '-'
                                || substr(s.cause, 17, 4) || '-' || substr(s.cause, 21))
                           FROM soniq_workflow_settle AS s WHERE s.job_id = soniq_jobs.id),
           expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now', '+300 seconds'),
           updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
     WHERE id IN (SELECT s.job_id FROM soniq_workflow_settle AS s WHERE s.cause IS NOT NULL)
       AND status = 'queued';
    UPDATE soniq_job_waits
       SET pending = pending - (SELECT count(*) FROM soniq_job_dependencies AS e
                                 WHERE e.job_id = soniq_job_waits.job_id AND e.state = 'waiting'
                                   AND e.depends_on IN (SELECT s.job_id
                                                          FROM soniq_workflow_settle AS s))
     WHERE job_id IN (SELECT e.job_id FROM soniq_job_dependencies AS e
                       WHERE e.state = 'waiting'
                         AND e.depends_on IN (SELECT s.job_id FROM soniq_workflow_settle AS s))
       AND job_id NOT IN (SELECT s.job_id FROM soniq_workflow_settle AS s);
    UPDATE soniq_job_dependencies
       SET state = CASE WHEN (SELECT s.failed FROM soniq_workflow_settle AS s
                               WHERE s.job_id = soniq_job_dependencies.depends_on)
                        THEN 'failed' ELSE 'done' END
     WHERE state = 'waiting'
       AND depends_on IN (SELECT s.job_id FROM soniq_workflow_settle AS s);
    DELETE FROM soniq_job_waits
     WHERE job_id IN (SELECT s.job_id FROM soniq_workflow_settle AS s WHERE s.cause IS NOT NULL);
    UPDATE soniq_jobs
       SET scheduled_at = (SELECT w.run_at FROM soniq_job_waits AS w
                            WHERE w.job_id = soniq_jobs.id),
           updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
     WHERE id IN (SELECT w.job_id FROM soniq_job_waits AS w WHERE w.pending <= 0)
       AND status = 'queued';
    DELETE FROM soniq_job_waits WHERE pending <= 0;
    DELETE FROM soniq_workflow_settle;
END;

CREATE TRIGGER soniq_dependent_guard AFTER UPDATE OF scheduled_at ON soniq_jobs
FOR EACH ROW
WHEN OLD.scheduled_at = '9999-01-01 00:00:00' AND NEW.scheduled_at IS NOT OLD.scheduled_at
     AND EXISTS (SELECT 1 FROM soniq_job_waits AS w WHERE w.job_id = NEW.id AND w.pending > 0)
BEGIN
    UPDATE soniq_job_waits SET run_at = NEW.scheduled_at WHERE job_id = NEW.id;
    UPDATE soniq_jobs SET scheduled_at = OLD.scheduled_at WHERE id = NEW.id;
END;
