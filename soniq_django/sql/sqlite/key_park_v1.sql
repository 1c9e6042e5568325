-- soniq_django limits per key, the jobs that reach their key later: the SQLite twin
-- of ../key_park_v1.sql (read that file for the rules), run by migration
-- 0032_key_park on SQLite; its reverse is key_park_v1.down.sql here. Never edited
-- once released.
--
-- SQLite has no functions: a replayed dead letter and a keyed job enqueued with
-- depends_on that waits for nothing are parked by Python (producer/keyed.py,
-- park_portable). A waiting keyed job is released by workflows_v1.sql's triggers,
-- which set its scheduled_at back from 9999-01-01: soniq_key_released catches that
-- write -- a keyed queued row leaving 9999-01-01 that is neither its key's head (the
-- admission, soniq_key_admit, names the head before it writes the row) nor parked,
-- and waits for nothing -- and parks the row under its key instead, as the enqueue
-- does (a more urgent due job, or one due sooner than a head not yet due, takes the
-- head's place), then pokes the key's admission.

CREATE TRIGGER soniq_key_dead_letter AFTER DELETE ON soniq_jobs
FOR EACH ROW
WHEN OLD.concurrency_key IS NOT NULL
BEGIN
    UPDATE soniq_dead_letter_jobs SET concurrency_key = OLD.concurrency_key
     WHERE id = OLD.id AND concurrency_key IS NOT OLD.concurrency_key;
END;

CREATE TRIGGER soniq_key_released AFTER UPDATE OF scheduled_at ON soniq_jobs
FOR EACH ROW
WHEN OLD.concurrency_key IS NOT NULL AND NEW.status = 'queued'
     AND OLD.scheduled_at = '9999-01-01 00:00:00'
     AND NEW.scheduled_at IS NOT '9999-01-01 00:00:00'
     AND NOT EXISTS (SELECT 1 FROM soniq_key_slots AS s
                      WHERE s.queue = NEW.queue AND s.key = NEW.concurrency_key
                        AND s.head = NEW.id)
     AND NOT EXISTS (SELECT 1 FROM soniq_key_parked AS p WHERE p.job_id = NEW.id)
     AND NOT EXISTS (SELECT 1 FROM soniq_job_waits AS w
                      WHERE w.job_id = NEW.id AND w.pending > 0)
BEGIN
    INSERT OR IGNORE INTO soniq_key_slots (queue, key, running, pokes, updated_at)
    VALUES (NEW.queue, NEW.concurrency_key, 0, 0, strftime('%Y-%m-%d %H:%M:%f', 'now'));
    INSERT INTO soniq_key_parked (job_id, queue, key, priority, created_at, run_at)
    VALUES (NEW.id, NEW.queue, NEW.concurrency_key, NEW.priority, NEW.created_at,
            NEW.scheduled_at);
    UPDATE soniq_jobs SET scheduled_at = '9999-01-01 00:00:00' WHERE id = NEW.id;
    -- A more urgent due job takes a queued head's place; so does a due job, or one
    -- due sooner, the place of a head not yet due.
    INSERT OR IGNORE INTO soniq_key_parked (job_id, queue, key, priority, created_at, run_at)
    SELECT j.id, j.queue, j.concurrency_key, j.priority, j.created_at, s.head_run_at
      FROM soniq_key_slots AS s JOIN soniq_jobs AS j ON j.id = s.head
     WHERE s.queue = NEW.queue AND s.key = NEW.concurrency_key AND j.status = 'queued'
       AND (((NEW.scheduled_at IS NULL OR NEW.scheduled_at <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
             AND (s.head_run_at > strftime('%Y-%m-%d %H:%M:%f', 'now') OR j.priority > NEW.priority))
            OR (NEW.scheduled_at > strftime('%Y-%m-%d %H:%M:%f', 'now')
                AND s.head_run_at > strftime('%Y-%m-%d %H:%M:%f', 'now')
                AND NEW.scheduled_at < s.head_run_at));
    UPDATE soniq_jobs SET scheduled_at = '9999-01-01 00:00:00'
     WHERE status = 'queued'
       AND id = (SELECT s.head FROM soniq_key_slots AS s
                  WHERE s.queue = NEW.queue AND s.key = NEW.concurrency_key)
       AND EXISTS (SELECT 1 FROM soniq_key_parked AS p
                    WHERE p.job_id = (SELECT s.head FROM soniq_key_slots AS s
                                       WHERE s.queue = NEW.queue
                                         AND s.key = NEW.concurrency_key));
    UPDATE soniq_key_slots SET head = NULL, head_run_at = NULL
     WHERE queue = NEW.queue AND key = NEW.concurrency_key
       AND head IN (SELECT p.job_id FROM soniq_key_parked AS p);
    UPDATE soniq_key_slots SET pokes = pokes + 1
     WHERE queue = NEW.queue AND key = NEW.concurrency_key;
END;
