-- soniq_django key order, version 1 (SQLite): the twin of ../key_order_v1.sql.
--
-- Replaces the trigger soniq_key_admit (claim_protocol_v12.sql) with one that
-- offers the key's most urgent due job: by priority, then by how long it has
-- been due (its run_at; an unscheduled job's enqueue time); with none due, the
-- job due first, at its time. SQLite reads the key's jobs in that order
-- (soniq_key_parked_rank_idx) up to its first due one: one writer at a time and
-- a first run's backlog, where PostgreSQL reads one entry per priority level.
-- Loaded by migration 0033_key_admit_exact; never edited once released. The
-- reverse (key_order_v1.down.sql) drops it, and the migration puts version
-- 12's back from sqlite/claim_protocol_v12.sql.

DROP TRIGGER soniq_key_admit;

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
       SET head = coalesce(
               (SELECT p.job_id FROM soniq_key_parked AS p
                 WHERE p.queue = NEW.queue AND p.key = NEW.key
                   AND (p.run_at IS NULL OR p.run_at <= strftime('%Y-%m-%d %H:%M:%f', 'now'))
                 ORDER BY p.priority, coalesce(p.run_at, p.created_at) LIMIT 1),
               (SELECT p.job_id FROM soniq_key_parked AS p
                 WHERE p.queue = NEW.queue AND p.key = NEW.key AND p.run_at IS NOT NULL
                 ORDER BY p.run_at LIMIT 1))
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
