-- soniq_django limits per key: the SQLite twin of ../claim_protocol_v12.sql (read
-- that file for the rules), run by migration 0029_keys on SQLite; its reverse is
-- claim_protocol_v12.down.sql here. SQLite has no functions: the admission is the
-- trigger soniq_key_admit, run by a write of soniq_key_slots.pokes, and the limits
-- in force are read by the subqueries each statement repeats (an operator's
-- soniq_key_limits row, exact key first, then the longest '*' pattern; else what the
-- jobs declared). Every write holds SQLite's one write lock: the counting needs no
-- row lock. Dates are compared as Django stores them (ISO text); a time computed
-- here has milliseconds and is rounded up by one, so that it is never early.

CREATE TRIGGER soniq_key_moved AFTER UPDATE OF status, claim_generation ON soniq_jobs
FOR EACH ROW
WHEN OLD.concurrency_key IS NOT NULL
     AND (OLD.status IS NOT NEW.status OR OLD.claim_generation IS NOT NEW.claim_generation)
BEGIN
    INSERT OR IGNORE INTO soniq_key_slots (queue, key, running, pokes, updated_at)
    VALUES (OLD.queue, OLD.concurrency_key, 0, 0, strftime('%Y-%m-%d %H:%M:%f', 'now'));
    -- What it leaves: a processing row's slot, kept by the claim's hold if it has one.
    INSERT OR IGNORE INTO soniq_key_holds (job_id, generation, queue, key)
    SELECT OLD.id, OLD.claim_generation, OLD.queue, OLD.concurrency_key
     WHERE OLD.status = 'processing' AND EXISTS (SELECT 1 FROM soniq_queue_holds AS h WHERE h.job_id = OLD.id AND h.generation = OLD.claim_generation);
    UPDATE soniq_key_slots SET running = running - 1, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
     WHERE queue = OLD.queue AND key = OLD.concurrency_key AND OLD.status = 'processing' AND NOT EXISTS (SELECT 1 FROM soniq_queue_holds AS h WHERE h.job_id = OLD.id AND h.generation = OLD.claim_generation);
    -- A queued row: the head's place freed, or its parked row gone.
    UPDATE soniq_key_slots SET head = NULL, head_run_at = NULL
     WHERE queue = OLD.queue AND key = OLD.concurrency_key AND OLD.status = 'queued' AND head = OLD.id;
    DELETE FROM soniq_key_parked WHERE OLD.status = 'queued' AND job_id = OLD.id;
    -- Where it goes: a claim takes a slot (and logs a start for a rate).
    UPDATE soniq_key_slots SET running = running + 1, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
     WHERE queue = OLD.queue AND key = OLD.concurrency_key AND NEW.status = 'processing';
    INSERT INTO soniq_key_starts (queue, key, started_at)
    SELECT OLD.queue, OLD.concurrency_key, coalesce(NEW.claimed_at, NEW.updated_at)
     WHERE NEW.status = 'processing'
       AND coalesce((SELECT l.rate_limit FROM soniq_key_limits AS l
                  WHERE l.queue = OLD.queue AND (l.key_pattern = OLD.concurrency_key OR OLD.concurrency_key GLOB replace(replace(
                        l.key_pattern, '[', '[[]'), '?', '[?]'))
                  ORDER BY (l.key_pattern = OLD.concurrency_key) DESC, length(l.key_pattern) DESC LIMIT 1),
                 (SELECT s.configured_rate_limit FROM soniq_key_slots AS s
                   WHERE s.queue = OLD.queue AND s.key = OLD.concurrency_key)) IS NOT NULL;
    -- Back in the queue (a retry, a deferral, a lapsed lease): parked again.
    INSERT OR REPLACE INTO soniq_key_parked (job_id, queue, key, priority, created_at, run_at)
    SELECT NEW.id, NEW.queue, NEW.concurrency_key, NEW.priority, NEW.created_at,
           NEW.scheduled_at
     WHERE NEW.status = 'queued';
    UPDATE soniq_jobs SET scheduled_at = '9999-01-01 00:00:00'
     WHERE id = NEW.id AND NEW.status = 'queued';
    -- A head not yet due gives its place to this job when it is due sooner.
    INSERT OR IGNORE INTO soniq_key_parked (job_id, queue, key, priority, created_at, run_at)
    SELECT j.id, j.queue, j.concurrency_key, j.priority, j.created_at, s.head_run_at
      FROM soniq_key_slots AS s JOIN soniq_jobs AS j ON j.id = s.head
     WHERE NEW.status = 'queued' AND s.queue = OLD.queue AND s.key = OLD.concurrency_key
       AND j.status = 'queued' AND s.head_run_at > strftime('%Y-%m-%d %H:%M:%f', 'now')
       AND (NEW.scheduled_at IS NULL OR NEW.scheduled_at < s.head_run_at);
    UPDATE soniq_jobs SET scheduled_at = '9999-01-01 00:00:00'
     WHERE status = 'queued' AND id = (SELECT s.head FROM soniq_key_slots AS s
              WHERE NEW.status = 'queued' AND s.queue = OLD.queue AND s.key = OLD.concurrency_key
                AND s.head_run_at > strftime('%Y-%m-%d %H:%M:%f', 'now')
                AND (NEW.scheduled_at IS NULL OR NEW.scheduled_at < s.head_run_at));
    UPDATE soniq_key_slots SET head = NULL, head_run_at = NULL
     WHERE NEW.status = 'queued' AND queue = OLD.queue AND key = OLD.concurrency_key
       AND head_run_at > strftime('%Y-%m-%d %H:%M:%f', 'now')
       AND (NEW.scheduled_at IS NULL OR NEW.scheduled_at < head_run_at);
    UPDATE soniq_key_slots SET pokes = pokes + 1 WHERE queue = OLD.queue AND key = OLD.concurrency_key;
END;

CREATE TRIGGER soniq_key_gone AFTER DELETE ON soniq_jobs
FOR EACH ROW
WHEN OLD.concurrency_key IS NOT NULL AND OLD.status IN ('queued', 'processing')
BEGIN
    INSERT OR IGNORE INTO soniq_key_slots (queue, key, running, pokes, updated_at)
    VALUES (OLD.queue, OLD.concurrency_key, 0, 0, strftime('%Y-%m-%d %H:%M:%f', 'now'));
    INSERT OR IGNORE INTO soniq_key_holds (job_id, generation, queue, key)
    SELECT OLD.id, OLD.claim_generation, OLD.queue, OLD.concurrency_key
     WHERE OLD.status = 'processing' AND EXISTS (SELECT 1 FROM soniq_queue_holds AS h WHERE h.job_id = OLD.id AND h.generation = OLD.claim_generation);
    UPDATE soniq_key_slots SET running = running - 1, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
     WHERE queue = OLD.queue AND key = OLD.concurrency_key AND OLD.status = 'processing' AND NOT EXISTS (SELECT 1 FROM soniq_queue_holds AS h WHERE h.job_id = OLD.id AND h.generation = OLD.claim_generation);
    UPDATE soniq_key_slots SET head = NULL, head_run_at = NULL
     WHERE queue = OLD.queue AND key = OLD.concurrency_key AND OLD.status = 'queued' AND head = OLD.id;
    DELETE FROM soniq_key_parked WHERE OLD.status = 'queued' AND job_id = OLD.id;
    UPDATE soniq_key_slots SET pokes = pokes + 1 WHERE queue = OLD.queue AND key = OLD.concurrency_key;
END;

CREATE TRIGGER soniq_key_deferred AFTER UPDATE OF attempts ON soniq_jobs
FOR EACH ROW
WHEN OLD.concurrency_key IS NOT NULL AND OLD.status = 'processing'
     AND NEW.status = 'processing' AND NEW.claim_generation = OLD.claim_generation
     AND NEW.attempts < OLD.attempts
BEGIN
    DELETE FROM soniq_key_starts
     WHERE id = (SELECT t.id FROM soniq_key_starts AS t
                  WHERE t.queue = OLD.queue AND t.key = OLD.concurrency_key AND t.started_at = OLD.claimed_at
                  LIMIT 1);
END;

CREATE TRIGGER soniq_key_hold_gone AFTER DELETE ON soniq_queue_holds
FOR EACH ROW
WHEN EXISTS (SELECT 1 FROM soniq_key_holds AS k
              WHERE k.job_id = OLD.job_id AND k.generation = OLD.generation)
BEGIN
    UPDATE soniq_key_slots SET running = running - 1, updated_at = strftime('%Y-%m-%d %H:%M:%f', 'now')
     WHERE (queue, key) = (SELECT k.queue, k.key FROM soniq_key_holds AS k
                            WHERE k.job_id = OLD.job_id AND k.generation = OLD.generation);
    UPDATE soniq_key_slots SET pokes = pokes + 1
     WHERE (queue, key) = (SELECT k.queue, k.key FROM soniq_key_holds AS k
                            WHERE k.job_id = OLD.job_id AND k.generation = OLD.generation);
    DELETE FROM soniq_key_holds WHERE job_id = OLD.job_id AND generation = OLD.generation;
END;

-- The admission: with no head and room under the concurrency, the key's next job
-- becomes the head -- a due one when it has one, of three index descents (read the
-- PostgreSQL file's soniq_key_admit_v1) -- due at its own time or, for a
-- rate, no earlier than the N-th latest start plus the period.
CREATE TRIGGER soniq_key_admit AFTER UPDATE OF pokes ON soniq_key_slots
FOR EACH ROW
WHEN NEW.head IS NULL
BEGIN
    DELETE FROM soniq_key_starts
     WHERE queue = NEW.queue AND key = NEW.key
       AND started_at <= strftime('%Y-%m-%d %H:%M:%f', 'now',
                                  '-' || coalesce((SELECT l.rate_period FROM soniq_key_limits AS l
                  WHERE l.queue = NEW.queue AND (l.key_pattern = NEW.key OR NEW.key GLOB replace(replace(
                        l.key_pattern, '[', '[[]'), '?', '[?]'))
                  ORDER BY (l.key_pattern = NEW.key) DESC, length(l.key_pattern) DESC LIMIT 1),
                 (SELECT s.configured_rate_period FROM soniq_key_slots AS s
                   WHERE s.queue = NEW.queue AND s.key = NEW.key)) || ' seconds');
    UPDATE soniq_key_slots
       SET head = (SELECT c.job_id FROM (
                      SELECT * FROM (SELECT p.job_id, p.run_at, p.priority, p.created_at
                                       FROM soniq_key_parked AS p
                                      WHERE p.queue = NEW.queue AND p.key = NEW.key
                                      ORDER BY p.priority, p.created_at LIMIT 1)
                      UNION ALL
                      SELECT * FROM (SELECT p.job_id, p.run_at, p.priority, p.created_at
                                       FROM soniq_key_parked AS p
                                      WHERE p.queue = NEW.queue AND p.key = NEW.key
                                        AND p.run_at IS NULL
                                      ORDER BY p.priority, p.created_at LIMIT 1)
                      UNION ALL
                      SELECT * FROM (SELECT p.job_id, p.run_at, p.priority, p.created_at
                                       FROM soniq_key_parked AS p
                                      WHERE p.queue = NEW.queue AND p.key = NEW.key
                                        AND p.run_at IS NOT NULL
                                      ORDER BY p.run_at LIMIT 1)) AS c
                    ORDER BY (c.run_at IS NULL OR c.run_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')) DESC,
                             CASE WHEN c.run_at IS NULL OR c.run_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')
                                  THEN c.priority END,
                             CASE WHEN c.run_at IS NULL OR c.run_at <= strftime('%Y-%m-%d %H:%M:%f', 'now')
                                  THEN c.created_at END,
                             c.run_at
                    LIMIT 1)
     WHERE id = NEW.id AND head IS NULL
       AND (coalesce((SELECT l.concurrency FROM soniq_key_limits AS l
                  WHERE l.queue = NEW.queue AND (l.key_pattern = NEW.key OR NEW.key GLOB replace(replace(
                        l.key_pattern, '[', '[[]'), '?', '[?]'))
                  ORDER BY (l.key_pattern = NEW.key) DESC, length(l.key_pattern) DESC LIMIT 1),
                 (SELECT s.configured_concurrency FROM soniq_key_slots AS s
                   WHERE s.queue = NEW.queue AND s.key = NEW.key)) IS NULL
            OR running < coalesce((SELECT l.concurrency FROM soniq_key_limits AS l
                  WHERE l.queue = NEW.queue AND (l.key_pattern = NEW.key OR NEW.key GLOB replace(replace(
                        l.key_pattern, '[', '[[]'), '?', '[?]'))
                  ORDER BY (l.key_pattern = NEW.key) DESC, length(l.key_pattern) DESC LIMIT 1),
                 (SELECT s.configured_concurrency FROM soniq_key_slots AS s
                   WHERE s.queue = NEW.queue AND s.key = NEW.key)));
    UPDATE soniq_jobs
       SET scheduled_at = (
           SELECT CASE WHEN n.nth IS NULL THEN p.run_at
                       WHEN p.run_at IS NULL OR p.run_at < n.nth THEN n.nth
                       ELSE p.run_at END
             FROM soniq_key_parked AS p,
                  (SELECT strftime('%Y-%m-%d %H:%M:%f', t.started_at,
                                   '+' || (coalesce((SELECT l.rate_period FROM soniq_key_limits AS l
                  WHERE l.queue = NEW.queue AND (l.key_pattern = NEW.key OR NEW.key GLOB replace(replace(
                        l.key_pattern, '[', '[[]'), '?', '[?]'))
                  ORDER BY (l.key_pattern = NEW.key) DESC, length(l.key_pattern) DESC LIMIT 1),
                 (SELECT s.configured_rate_period FROM soniq_key_slots AS s
                   WHERE s.queue = NEW.queue AND s.key = NEW.key)) + 0.001) || ' seconds')
                          AS nth
                     FROM (SELECT NULL) AS one
                     LEFT JOIN (SELECT started_at FROM soniq_key_starts
                                 WHERE queue = NEW.queue AND key = NEW.key
                                 ORDER BY started_at DESC
                                 LIMIT 1 OFFSET coalesce(coalesce((SELECT l.rate_limit FROM soniq_key_limits AS l
                  WHERE l.queue = NEW.queue AND (l.key_pattern = NEW.key OR NEW.key GLOB replace(replace(
                        l.key_pattern, '[', '[[]'), '?', '[?]'))
                  ORDER BY (l.key_pattern = NEW.key) DESC, length(l.key_pattern) DESC LIMIT 1),
                 (SELECT s.configured_rate_limit FROM soniq_key_slots AS s
                   WHERE s.queue = NEW.queue AND s.key = NEW.key)), 1) - 1) AS t
                       ON coalesce((SELECT l.rate_limit FROM soniq_key_limits AS l
                  WHERE l.queue = NEW.queue AND (l.key_pattern = NEW.key OR NEW.key GLOB replace(replace(
                        l.key_pattern, '[', '[[]'), '?', '[?]'))
                  ORDER BY (l.key_pattern = NEW.key) DESC, length(l.key_pattern) DESC LIMIT 1),
                 (SELECT s.configured_rate_limit FROM soniq_key_slots AS s
                   WHERE s.queue = NEW.queue AND s.key = NEW.key)) IS NOT NULL) AS n
            WHERE p.job_id = soniq_jobs.id)
     WHERE id = (SELECT s.head FROM soniq_key_slots AS s WHERE s.id = NEW.id) AND status = 'queued' AND scheduled_at = '9999-01-01 00:00:00';
    UPDATE soniq_key_slots
       SET head_run_at = (SELECT p.run_at FROM soniq_key_parked AS p WHERE p.job_id = head)
     WHERE id = NEW.id AND head IS NOT NULL;
    DELETE FROM soniq_key_parked WHERE job_id = (SELECT s.head FROM soniq_key_slots AS s WHERE s.id = NEW.id);
END;
