-- soniq_django workflows, version 2: the SQLite twin of ../workflows_v2.sql
-- (read that file for the rules), run by migration 0026_workflow_purge on
-- SQLite; its reverse is workflows_v2.down.sql here. Never edited once
-- released. A job's workflow rows go with it row by row: SQLite's row
-- triggers of one DELETE see the rows the statement deleted before, so of
-- two ends of an edge (or the last rows of a batch) deleted by one statement,
-- the trigger of the last one deleted finds the rest gone. SQLite has one
-- writer at a time: no two deletions race.

CREATE TRIGGER soniq_workflow_job_gone AFTER DELETE ON soniq_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d WHERE d.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_waits WHERE job_id = OLD.id;
    DELETE FROM soniq_job_dependencies
     WHERE (job_id = OLD.id OR depends_on = OLD.id)
       AND NOT EXISTS (SELECT 1 FROM soniq_jobs AS j
                        WHERE j.id IN (soniq_job_dependencies.job_id,
                                       soniq_job_dependencies.depends_on))
       AND NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                        WHERE d.id IN (soniq_job_dependencies.job_id,
                                       soniq_job_dependencies.depends_on));
    -- A batch this job was a member of, then its member rows.
    DELETE FROM soniq_batches
     WHERE id IN (SELECT b.id FROM soniq_batches AS b
                   WHERE b.id IN (SELECT m.batch_id FROM soniq_batch_members AS m
                                   WHERE m.job_id = OLD.id)
                     AND (b.callback_id IS NULL
                OR (NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = b.callback_id)
                    AND NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                     WHERE d.id = b.callback_id)))
           AND NOT EXISTS (
                SELECT 1 FROM soniq_batch_members AS m
                 WHERE m.batch_id = b.id
                   AND (EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = m.job_id)
                        OR EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                    WHERE d.id = m.job_id))));
    DELETE FROM soniq_batch_members
     WHERE batch_id IN (SELECT m.batch_id FROM soniq_batch_members AS m WHERE m.job_id = OLD.id)
       AND NOT EXISTS (SELECT 1 FROM soniq_batches AS b
                        WHERE b.id = soniq_batch_members.batch_id);
    -- A batch this job was the callback of: its member rows, then the batch.
    DELETE FROM soniq_batch_members
     WHERE batch_id IN (SELECT b.id FROM soniq_batches AS b
                         WHERE b.callback_id = OLD.id
                           AND (b.callback_id IS NULL
                OR (NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = b.callback_id)
                    AND NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                     WHERE d.id = b.callback_id)))
           AND NOT EXISTS (
                SELECT 1 FROM soniq_batch_members AS m
                 WHERE m.batch_id = b.id
                   AND (EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = m.job_id)
                        OR EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                    WHERE d.id = m.job_id))));
    DELETE FROM soniq_batches
     WHERE id IN (SELECT b.id FROM soniq_batches AS b
                   WHERE b.callback_id = OLD.id
                     AND (b.callback_id IS NULL
                OR (NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = b.callback_id)
                    AND NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                     WHERE d.id = b.callback_id)))
           AND NOT EXISTS (
                SELECT 1 FROM soniq_batch_members AS m
                 WHERE m.batch_id = b.id
                   AND (EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = m.job_id)
                        OR EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                    WHERE d.id = m.job_id))));
END;

CREATE TRIGGER soniq_workflow_dead_letter_gone AFTER DELETE ON soniq_dead_letter_jobs
FOR EACH ROW
WHEN NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = OLD.id)
BEGIN
    DELETE FROM soniq_job_waits WHERE job_id = OLD.id;
    DELETE FROM soniq_job_dependencies
     WHERE (job_id = OLD.id OR depends_on = OLD.id)
       AND NOT EXISTS (SELECT 1 FROM soniq_jobs AS j
                        WHERE j.id IN (soniq_job_dependencies.job_id,
                                       soniq_job_dependencies.depends_on))
       AND NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                        WHERE d.id IN (soniq_job_dependencies.job_id,
                                       soniq_job_dependencies.depends_on));
    -- A batch this job was a member of, then its member rows.
    DELETE FROM soniq_batches
     WHERE id IN (SELECT b.id FROM soniq_batches AS b
                   WHERE b.id IN (SELECT m.batch_id FROM soniq_batch_members AS m
                                   WHERE m.job_id = OLD.id)
                     AND (b.callback_id IS NULL
                OR (NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = b.callback_id)
                    AND NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                     WHERE d.id = b.callback_id)))
           AND NOT EXISTS (
                SELECT 1 FROM soniq_batch_members AS m
                 WHERE m.batch_id = b.id
                   AND (EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = m.job_id)
                        OR EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                    WHERE d.id = m.job_id))));
    DELETE FROM soniq_batch_members
     WHERE batch_id IN (SELECT m.batch_id FROM soniq_batch_members AS m WHERE m.job_id = OLD.id)
       AND NOT EXISTS (SELECT 1 FROM soniq_batches AS b
                        WHERE b.id = soniq_batch_members.batch_id);
    -- A batch this job was the callback of: its member rows, then the batch.
    DELETE FROM soniq_batch_members
     WHERE batch_id IN (SELECT b.id FROM soniq_batches AS b
                         WHERE b.callback_id = OLD.id
                           AND (b.callback_id IS NULL
                OR (NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = b.callback_id)
                    AND NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                     WHERE d.id = b.callback_id)))
           AND NOT EXISTS (
                SELECT 1 FROM soniq_batch_members AS m
                 WHERE m.batch_id = b.id
                   AND (EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = m.job_id)
                        OR EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                    WHERE d.id = m.job_id))));
    DELETE FROM soniq_batches
     WHERE id IN (SELECT b.id FROM soniq_batches AS b
                   WHERE b.callback_id = OLD.id
                     AND (b.callback_id IS NULL
                OR (NOT EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = b.callback_id)
                    AND NOT EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                     WHERE d.id = b.callback_id)))
           AND NOT EXISTS (
                SELECT 1 FROM soniq_batch_members AS m
                 WHERE m.batch_id = b.id
                   AND (EXISTS (SELECT 1 FROM soniq_jobs AS j WHERE j.id = m.job_id)
                        OR EXISTS (SELECT 1 FROM soniq_dead_letter_jobs AS d
                                    WHERE d.id = m.job_id))));
END;
