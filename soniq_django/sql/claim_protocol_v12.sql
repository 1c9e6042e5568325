-- soniq_django claim protocol, version 12 (PostgreSQL only): limits per key.
--
-- Versions 1 to 11 stay as they are; no released function gets a new body.
-- This file adds the enqueue of a keyed job (soniq_enqueue_keyed) and the
-- triggers that keep each key's slots as its job rows move. Loaded by
-- migration 0029_keys after the tables; never edited once released. The
-- reverse is claim_protocol_v12.down.sql. SQLite twin:
-- sql/sqlite/claim_protocol_v12.sql. See docs/decisions/0047-limits-per-key.md.
--
-- A keyed job (soniq_jobs.concurrency_key set) is inserted *parked*: queued
-- at 9999-01-01 UTC, in no claim index (decision 0018), with its own due
-- time in soniq_key_parked. Each key (queue, concurrency_key) has a row in
-- soniq_key_slots: running (its processing rows plus the slots its
-- timed-out handlers keep) and head (the one job it offers to the claims).
-- A head is admitted -- its due time put back -- only while running is
-- under the key's concurrency, and for a rate not before the N-th latest
-- start plus the period. The claim functions are unchanged: they see a
-- head as any queued job and never read a parked one.
--
-- The counting is done by row triggers, under the key's row lock, in the
-- transaction of the write that moves the row, whoever writes it (this
-- worker, a worker in another language, the reaper, an operator):
--
--   queued -> processing    running + 1 (the slot is taken in the claim's
--                           transaction), a start logged for a rate, the
--                           next head admitted while there is room;
--   processing -> anything  running - 1 and the next head admitted, unless
--   (or deleted)            a soniq_queue_holds row of the claim exists (the
--                           timeout's soniq_hold_slot, same transaction):
--                           then the slot moves to soniq_key_holds and is
--                           given back when that hold row is deleted;
--   -> queued               parked again with its new due time (a retry, a
--                           deferral, a lapsed lease put back);
--   queued -> gone/ended    a parked job's row deleted, a head's place freed.
--
-- A processing row leaves processing once per claim generation, and a hold
-- row is deleted once: each slot is given back exactly once.

-- soniq_key_limit_v1: the limits in force for one key --
-- The operator's row of soniq_key_limits for the key (exact) or else the
-- longest matching pattern ('*' is any text), field by field over what the
-- key's jobs declared (soniq_key_slots.configured_*). The override rows are
-- an operator's handful: reading them all per admission is cheap.
CREATE FUNCTION {schema}.soniq_key_limit_v1(
    p_queue text, p_key text,
    OUT concurrency integer, OUT rate_limit integer, OUT rate_period integer)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    o record;
    s record;
BEGIN
    SELECT l.concurrency, l.rate_limit, l.rate_period INTO o
      FROM {schema}.soniq_key_limits AS l
     WHERE l.queue = p_queue
       AND (l.key_pattern = p_key
            OR p_key LIKE pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
                   pg_catalog.replace(l.key_pattern, '\', '\\'), '%', '\%'), '_', '\_'),
                   '*', '%'))
     ORDER BY (l.key_pattern = p_key) DESC, pg_catalog.length(l.key_pattern) DESC
     LIMIT 1;
    SELECT k.configured_concurrency, k.configured_rate_limit, k.configured_rate_period INTO s
      FROM {schema}.soniq_key_slots AS k
     WHERE k.queue = p_queue AND k.key = p_key;
    concurrency := coalesce(o.concurrency, s.configured_concurrency);
    IF o.rate_limit IS NOT NULL THEN
        rate_limit := o.rate_limit; rate_period := o.rate_period;
    ELSE
        rate_limit := s.configured_rate_limit; rate_period := s.configured_rate_period;
    END IF;
END
$fn$;

-- soniq_key_admit_v1: offer the key's next job, if it has room --
-- The caller holds the key's soniq_key_slots row lock. With no head and
-- running under the concurrency, the key's next job becomes the head: its
-- row is deleted from soniq_key_parked and its due time put back (for a
-- rate, no earlier than the N-th latest start plus the period). The next job
-- is a due one (run_at NULL or past) whenever the key has one, so that a job
-- scheduled for later never blocks the key; with none due, the earliest due,
-- offered at its time. Three index descents, never a sort of the backlog:
-- the first job by (priority, created_at) (soniq_key_parked_order_idx), the
-- first with no run_at by (priority, created_at) (soniq_key_parked_now_idx,
-- partial) and the earliest run_at (soniq_key_parked_due_idx); of these, the due one first by (priority,
-- created_at), else the earliest due. The first job is the head whenever it
-- is due; when it is not, a due job with no run_at is preferred by priority,
-- and the scheduled jobs whose time has come by their due time (decision 0047).
-- A NOTIFY wakes the workers of the queue when it is due now.
CREATE FUNCTION {schema}.soniq_key_admit_v1(p_queue text, p_key text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_slot record;
    v_limit record;
    p record;
    v_at timestamptz;
    v_now timestamptz;
    v_nth timestamptz;
    v_gate text;
BEGIN
    SELECT k.running, k.head INTO v_slot
      FROM {schema}.soniq_key_slots AS k WHERE k.queue = p_queue AND k.key = p_key;
    IF NOT FOUND OR v_slot.head IS NOT NULL THEN
        RETURN;
    END IF;
    v_limit := {schema}.soniq_key_limit_v1(p_queue, p_key);
    IF v_limit.concurrency IS NOT NULL AND v_slot.running >= v_limit.concurrency THEN
        RETURN;
    END IF;
    v_gate := pg_catalog.current_setting('soniq.fenced_write', true);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    LOOP
        v_now := pg_catalog.clock_timestamp();
        SELECT c.job_id, c.run_at INTO p
          FROM ((SELECT q.job_id, q.run_at, q.priority, q.created_at
                   FROM {schema}.soniq_key_parked AS q
                  WHERE q.queue = p_queue AND q.key = p_key
                  ORDER BY q.priority, q.created_at LIMIT 1)
                UNION ALL
                (SELECT q.job_id, q.run_at, q.priority, q.created_at
                   FROM {schema}.soniq_key_parked AS q
                  WHERE q.queue = p_queue AND q.key = p_key AND q.run_at IS NULL
                  ORDER BY q.priority, q.created_at LIMIT 1)
                UNION ALL
                (SELECT q.job_id, q.run_at, q.priority, q.created_at
                   FROM {schema}.soniq_key_parked AS q
                  WHERE q.queue = p_queue AND q.key = p_key AND q.run_at IS NOT NULL
                  ORDER BY q.run_at LIMIT 1)) AS c
         ORDER BY (c.run_at IS NULL OR c.run_at <= v_now) DESC,
                  CASE WHEN c.run_at IS NULL OR c.run_at <= v_now THEN c.priority END,
                  CASE WHEN c.run_at IS NULL OR c.run_at <= v_now THEN c.created_at END,
                  c.run_at
         LIMIT 1;
        EXIT WHEN NOT FOUND;
        DELETE FROM {schema}.soniq_key_parked AS q WHERE q.job_id = p.job_id;
        v_at := p.run_at;
        IF v_limit.rate_limit IS NOT NULL THEN
            v_now := pg_catalog.clock_timestamp();
            DELETE FROM {schema}.soniq_key_starts AS t
             WHERE t.queue = p_queue AND t.key = p_key
               AND t.started_at <= v_now - pg_catalog.make_interval(secs => v_limit.rate_period);
            SELECT t.started_at INTO v_nth
              FROM {schema}.soniq_key_starts AS t
             WHERE t.queue = p_queue AND t.key = p_key
             ORDER BY t.started_at DESC
             OFFSET v_limit.rate_limit - 1 LIMIT 1;
            IF FOUND THEN
                v_at := GREATEST(coalesce(v_at, '-infinity'::timestamptz),
                                 v_nth + pg_catalog.make_interval(secs => v_limit.rate_period));
            END IF;
        END IF;
        -- By primary key only: the rest of the predicate is one IS TRUE, so the planner
        -- cannot take soniq_jobs_claim_due_idx (scheduled_at = 9999-01-01 is every parked
        -- job) and read them all -- as it would on statistics taken before they came
        -- (claim protocol v11 does the same for its completion).
        UPDATE {schema}.soniq_jobs AS j SET scheduled_at = v_at
         WHERE j.id = p.job_id
           AND (j.status = 'queued'
                AND j.scheduled_at = '9999-01-01 00:00:00+00'::timestamptz) IS TRUE;
        IF FOUND THEN
            UPDATE {schema}.soniq_key_slots AS k SET head = p.job_id, head_run_at = p.run_at
             WHERE k.queue = p_queue AND k.key = p_key;
            IF v_at IS NULL OR v_at <= pg_catalog.clock_timestamp() THEN
                PERFORM pg_catalog.pg_notify('soniq_new_job', p_queue);
            END IF;
            EXIT;
        END IF;
        -- A parked row whose job is no longer parked (changed by hand): dropped, next.
    END LOOP;
    PERFORM pg_catalog.set_config('soniq.fenced_write', coalesce(v_gate, 'off'), true);
END
$fn$;

-- soniq_key_moved_v1: the trigger function of a keyed row's move --
CREATE FUNCTION {schema}.soniq_key_moved_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_delta integer := 0;
    v_head uuid;
    v_head_at timestamptz;
    v_job record;
    v_limit record;
    v_gate text;
BEGIN
    -- The key's row, locked: every move of the key's jobs takes turns on it.
    INSERT INTO {schema}.soniq_key_slots AS k (queue, key, running, updated_at)
    VALUES (OLD.queue, OLD.concurrency_key, 0, pg_catalog.clock_timestamp())
    ON CONFLICT ON CONSTRAINT soniq_key_slots_key DO NOTHING;
    SELECT k.head INTO v_head FROM {schema}.soniq_key_slots AS k
     WHERE k.queue = OLD.queue AND k.key = OLD.concurrency_key
       FOR UPDATE;
    -- What it leaves.
    IF OLD.status = 'processing' THEN
        IF EXISTS (SELECT 1 FROM {schema}.soniq_queue_holds AS h
                    WHERE h.job_id = OLD.id AND h.generation = OLD.claim_generation) THEN
            INSERT INTO {schema}.soniq_key_holds (job_id, generation, queue, key)
            VALUES (OLD.id, OLD.claim_generation, OLD.queue, OLD.concurrency_key)
            ON CONFLICT ON CONSTRAINT soniq_key_holds_claim DO NOTHING;
        ELSE
            v_delta := v_delta - 1;
        END IF;
    ELSIF OLD.status = 'queued' THEN
        IF v_head = OLD.id THEN
            v_head := NULL;
            UPDATE {schema}.soniq_key_slots AS k SET head = NULL, head_run_at = NULL
             WHERE k.queue = OLD.queue AND k.key = OLD.concurrency_key;
        ELSE
            DELETE FROM {schema}.soniq_key_parked AS q WHERE q.job_id = OLD.id;
        END IF;
    END IF;
    -- Where it goes.
    IF TG_OP = 'UPDATE' AND NEW.status = 'processing' THEN
        v_delta := v_delta + 1;
        v_limit := {schema}.soniq_key_limit_v1(OLD.queue, OLD.concurrency_key);
        IF v_limit.rate_limit IS NOT NULL THEN
            INSERT INTO {schema}.soniq_key_starts (queue, key, started_at)
            VALUES (OLD.queue, OLD.concurrency_key,
                    coalesce(NEW.claimed_at, pg_catalog.clock_timestamp()));
        END IF;
    ELSIF TG_OP = 'UPDATE' AND NEW.status = 'queued' THEN
        -- Back in the queue (a retry, a deferral, a lapsed lease): parked again.
        INSERT INTO {schema}.soniq_key_parked (job_id, queue, key, priority, created_at, run_at)
        VALUES (NEW.id, NEW.queue, NEW.concurrency_key, NEW.priority, NEW.created_at,
                NEW.scheduled_at)
        ON CONFLICT (job_id) DO UPDATE SET run_at = EXCLUDED.run_at;
        v_gate := pg_catalog.current_setting('soniq.fenced_write', true);
        PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
        UPDATE {schema}.soniq_jobs AS j SET scheduled_at = '9999-01-01 00:00:00+00'::timestamptz
         WHERE j.id = NEW.id;
        -- A head not yet due gives its place to this job when it is due sooner (the
        -- admission below picks the key's head again).
        SELECT k.head_run_at INTO v_head_at FROM {schema}.soniq_key_slots AS k
         WHERE k.queue = OLD.queue AND k.key = OLD.concurrency_key;
        IF v_head IS NOT NULL AND v_head_at > pg_catalog.clock_timestamp()
           AND (NEW.scheduled_at IS NULL OR NEW.scheduled_at < v_head_at) THEN
            UPDATE {schema}.soniq_jobs AS j
               SET scheduled_at = '9999-01-01 00:00:00+00'::timestamptz
             WHERE j.id = v_head AND (j.status = 'queued') IS TRUE  -- by primary key
            RETURNING j.priority, j.created_at INTO v_job;
            IF FOUND THEN
                INSERT INTO {schema}.soniq_key_parked
                       (job_id, queue, key, priority, created_at, run_at)
                VALUES (v_head, OLD.queue, OLD.concurrency_key, v_job.priority,
                        v_job.created_at, v_head_at)
                ON CONFLICT (job_id) DO NOTHING;
            END IF;
            UPDATE {schema}.soniq_key_slots AS k SET head = NULL, head_run_at = NULL
             WHERE k.queue = OLD.queue AND k.key = OLD.concurrency_key;
        END IF;
        PERFORM pg_catalog.set_config('soniq.fenced_write', coalesce(v_gate, 'off'), true);
    END IF;
    IF v_delta <> 0 THEN
        UPDATE {schema}.soniq_key_slots AS k
           SET running = k.running + v_delta, updated_at = pg_catalog.clock_timestamp()
         WHERE k.queue = OLD.queue AND k.key = OLD.concurrency_key;
    END IF;
    PERFORM {schema}.soniq_key_admit_v1(OLD.queue, OLD.concurrency_key);
    RETURN NULL;
END
$fn$;

-- soniq_key_deferred_v1: a deferral gives its start back --
-- soniq_defer gives the attempt back (processing -> processing, attempts
-- one less) before it puts the row back in the queue: the key's start
-- logged at the claim's time (claimed_at) is deleted, one row.
CREATE FUNCTION {schema}.soniq_key_deferred_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    DELETE FROM {schema}.soniq_key_starts AS t
     WHERE t.ctid = (SELECT s.ctid FROM {schema}.soniq_key_starts AS s
                      WHERE s.queue = OLD.queue AND s.key = OLD.concurrency_key
                        AND s.started_at = OLD.claimed_at
                      LIMIT 1);
    RETURN NULL;
END
$fn$;

-- soniq_key_hold_gone_v1: a hold that kept a key's slot is gone --
-- The handler returned (soniq_release_hold), or the hold lapsed and was
-- deleted (soniq_hold_slot, soniq_key_sweep): the slot is given back.
CREATE FUNCTION {schema}.soniq_key_hold_gone_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r record;
BEGIN
    DELETE FROM {schema}.soniq_key_holds AS h
     WHERE h.job_id = OLD.job_id AND h.generation = OLD.generation
    RETURNING h.queue, h.key INTO r;
    IF FOUND THEN
        PERFORM 1 FROM {schema}.soniq_key_slots AS k
         WHERE k.queue = r.queue AND k.key = r.key FOR UPDATE;
        UPDATE {schema}.soniq_key_slots AS k
           SET running = k.running - 1, updated_at = pg_catalog.clock_timestamp()
         WHERE k.queue = r.queue AND k.key = r.key;
        PERFORM {schema}.soniq_key_admit_v1(r.queue, r.key);
    END IF;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER soniq_key_moved
    AFTER UPDATE OF status, claim_generation ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL
          AND (OLD.status IS DISTINCT FROM NEW.status
               OR OLD.claim_generation IS DISTINCT FROM NEW.claim_generation))
    EXECUTE FUNCTION {schema}.soniq_key_moved_v1();

CREATE TRIGGER soniq_key_gone
    AFTER DELETE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status IN ('queued', 'processing'))
    EXECUTE FUNCTION {schema}.soniq_key_moved_v1();

CREATE TRIGGER soniq_key_deferred
    AFTER UPDATE OF attempts ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL AND OLD.status = 'processing'
          AND NEW.status = 'processing' AND NEW.claim_generation = OLD.claim_generation
          AND NEW.attempts < OLD.attempts)
    EXECUTE FUNCTION {schema}.soniq_key_deferred_v1();

CREATE TRIGGER soniq_key_hold_gone
    AFTER DELETE ON {schema}.soniq_queue_holds
    FOR EACH ROW
    EXECUTE FUNCTION {schema}.soniq_key_hold_gone_v1();

-- soniq_key_sweep: give back the slots of lapsed holds --
-- A hold whose worker stopped renewing it has lapsed; soniq_hold_slot
-- deletes a queue's lapsed holds only when another timeout of that queue
-- comes. The workers' housekeeping calls this to delete the lapsed holds
-- that keep a key's slot (the trigger above gives the slots back). Returns
-- how many it deleted.
CREATE FUNCTION {schema}.soniq_key_sweep() RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_count integer;
BEGIN
    DELETE FROM {schema}.soniq_queue_holds AS h
     WHERE h.id IN (SELECT q.id FROM {schema}.soniq_queue_holds AS q
                      JOIN {schema}.soniq_key_holds AS k
                        ON k.job_id = q.job_id AND k.generation = q.generation
                     WHERE q.lease_expires_at <= pg_catalog.clock_timestamp()
                       FOR UPDATE OF q SKIP LOCKED);
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END
$fn$;

-- soniq_key_refresh: apply a changed limit at once --
-- For each key of p_queue matching p_pattern ('*' any text): a head that a
-- lower concurrency leaves without room is parked again; a key with room
-- gets its head. What an operator's override calls after its write (the
-- admission otherwise waits for the key's next move). Returns the keys seen.
CREATE FUNCTION {schema}.soniq_key_refresh(p_queue text, p_pattern text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    r record;
    v_limit record;
    v_slot record;
    v_job record;
    v_count integer := 0;
    v_gate text;
BEGIN
    FOR r IN
        SELECT k.queue, k.key FROM {schema}.soniq_key_slots AS k
         WHERE k.queue = p_queue
           AND k.key LIKE pg_catalog.replace(pg_catalog.replace(pg_catalog.replace(
                   pg_catalog.replace(p_pattern, '\', '\\'), '%', '\%'), '_', '\_'), '*', '%')
         ORDER BY k.key COLLATE "C"
    LOOP
        v_count := v_count + 1;
        PERFORM 1 FROM {schema}.soniq_key_slots AS k
         WHERE k.queue = r.queue AND k.key = r.key FOR UPDATE;
        v_limit := {schema}.soniq_key_limit_v1(r.queue, r.key);
        SELECT k.head, k.head_run_at, k.running INTO v_slot FROM {schema}.soniq_key_slots AS k
         WHERE k.queue = r.queue AND k.key = r.key;
        IF v_slot.head IS NOT NULL
           AND ((v_limit.concurrency IS NOT NULL AND v_slot.running >= v_limit.concurrency)
                OR v_limit.rate_limit IS NOT NULL) THEN
            -- Parked again; the admission below offers it (or another) as the limit allows.
            v_gate := pg_catalog.current_setting('soniq.fenced_write', true);
            PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
            UPDATE {schema}.soniq_jobs AS j
               SET scheduled_at = '9999-01-01 00:00:00+00'::timestamptz
             WHERE j.id = v_slot.head AND (j.status = 'queued') IS TRUE  -- by primary key
            RETURNING j.priority, j.created_at INTO v_job;
            IF FOUND THEN
                INSERT INTO {schema}.soniq_key_parked
                       (job_id, queue, key, priority, created_at, run_at)
                VALUES (v_slot.head, r.queue, r.key, v_job.priority, v_job.created_at,
                        v_slot.head_run_at)
                ON CONFLICT (job_id) DO NOTHING;
            END IF;
            PERFORM pg_catalog.set_config('soniq.fenced_write', coalesce(v_gate, 'off'), true);
            UPDATE {schema}.soniq_key_slots AS k SET head = NULL, head_run_at = NULL
             WHERE k.queue = r.queue AND k.key = r.key;
        END IF;
        PERFORM {schema}.soniq_key_admit_v1(r.queue, r.key);
    END LOOP;
    RETURN v_count;
END
$fn$;

-- soniq_enqueue_keyed: enqueue a job limited per key --
-- soniq_enqueue's parameters (its checks, codes and duplicate rules: it
-- calls soniq_enqueue), preceded by the key and its limits:
--   concurrency_key  the key (1 to 255 characters, no NUL);
--   key_concurrency  NULL, or at most this many of the key's jobs run at once;
--   key_rate         NULL, or 'N/s', 'N/m', 'N/h': at most N starts in any
--                    window of a second, a minute, an hour.
-- Bad values: SQLSTATE 22023, HINT SONIQ_INVALID_OPTION. The limits become
-- the key's configured ones (the last enqueue's win; an operator's
-- soniq_key_limits row overrides them). The job is inserted parked and the
-- key admits its next job if it has room; a unique or dedup job that finds
-- an equal queued job returns that job's id and changes nothing.
CREATE FUNCTION {schema}.soniq_enqueue_keyed(
    concurrency_key text,
    key_concurrency integer,
    key_rate text,
    job_name text,
    args jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT 'default',
    priority integer DEFAULT 100,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT 4,
    unique_job boolean DEFAULT false,
    dedup_key text DEFAULT NULL,
    producer_id text DEFAULT NULL,
    job_id uuid DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_variable
DECLARE
    p_key text := soniq_enqueue_keyed.concurrency_key;
    p_queue text := coalesce(soniq_enqueue_keyed.queue, 'default');
    v_id uuid := coalesce(soniq_enqueue_keyed.job_id, pg_catalog.gen_random_uuid());
    v_found uuid;
    v_rate_limit integer;
    v_rate_period integer;
    v_match text[];
    v_slot record;
    v_head record;
    v_new record;
    v_now timestamptz;
BEGIN
    IF p_key IS NULL OR p_key = '' OR pg_catalog.length(p_key) > 255 THEN
        RAISE EXCEPTION 'concurrency_key must be a non-empty string of at most 255 characters'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
    END IF;
    IF key_concurrency IS NOT NULL AND key_concurrency < 1 THEN
        RAISE EXCEPTION 'key_concurrency must be a positive integer or NULL'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
    END IF;
    IF key_rate IS NOT NULL THEN
        v_match := pg_catalog.regexp_match(key_rate, '^([1-9][0-9]{0,8})/([smh])$');
        IF v_match IS NULL THEN
            RAISE EXCEPTION 'key_rate must read N/s, N/m or N/h (N a positive integer)'
                USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
        END IF;
        v_rate_limit := v_match[1]::integer;
        v_rate_period := CASE v_match[2] WHEN 's' THEN 1 WHEN 'm' THEN 60 ELSE 3600 END;
    END IF;
    v_found := {schema}.soniq_enqueue(
        job_name, args, p_queue, priority, '9999-01-01 00:00:00+00'::timestamptz, max_attempts,
        unique_job, dedup_key, producer_id, v_id);
    IF v_found IS DISTINCT FROM v_id THEN
        RETURN v_found;  -- an equal queued job: nothing else changes
    END IF;
    UPDATE {schema}.soniq_jobs AS j SET concurrency_key = p_key WHERE j.id = v_id
    RETURNING j.priority, j.created_at INTO v_new;
    -- The key's row, locked; the limits declared by this enqueue become its configured ones.
    INSERT INTO {schema}.soniq_key_slots AS k
           (queue, key, running, configured_concurrency, configured_rate_limit,
            configured_rate_period, updated_at)
    VALUES (p_queue, p_key, 0, key_concurrency, v_rate_limit, v_rate_period,
            pg_catalog.clock_timestamp())
    ON CONFLICT ON CONSTRAINT soniq_key_slots_key DO UPDATE
       SET configured_concurrency = EXCLUDED.configured_concurrency,
           configured_rate_limit = EXCLUDED.configured_rate_limit,
           configured_rate_period = EXCLUDED.configured_rate_period
     WHERE (k.configured_concurrency, k.configured_rate_limit, k.configured_rate_period)
           IS DISTINCT FROM (EXCLUDED.configured_concurrency, EXCLUDED.configured_rate_limit,
                             EXCLUDED.configured_rate_period);
    SELECT k.head, k.head_run_at INTO v_slot FROM {schema}.soniq_key_slots AS k
     WHERE k.queue = p_queue AND k.key = p_key FOR UPDATE;
    INSERT INTO {schema}.soniq_key_parked (job_id, queue, key, priority, created_at, run_at)
    VALUES (v_id, p_queue, p_key, v_new.priority, v_new.created_at, run_at);
    -- Priorities win inside a key too: a more urgent due job takes a queued head's
    -- place; so does a due job, or one due sooner, the place of a head not yet due.
    IF v_slot.head IS NOT NULL THEN
        SELECT j.id, j.priority, j.created_at INTO v_head FROM {schema}.soniq_jobs AS j
         WHERE j.id = v_slot.head AND (j.status = 'queued') IS TRUE;  -- by primary key
        v_now := pg_catalog.clock_timestamp();
        IF FOUND AND (((run_at IS NULL OR run_at <= v_now)
                       AND (v_slot.head_run_at > v_now OR v_head.priority > v_new.priority))
                      OR (run_at > v_now AND v_slot.head_run_at > v_now
                          AND run_at < v_slot.head_run_at)) THEN
            PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
            UPDATE {schema}.soniq_jobs AS j
               SET scheduled_at = '9999-01-01 00:00:00+00'::timestamptz
             WHERE j.id = v_head.id;
            PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
            INSERT INTO {schema}.soniq_key_parked
                   (job_id, queue, key, priority, created_at, run_at)
            VALUES (v_head.id, p_queue, p_key, v_head.priority, v_head.created_at,
                    v_slot.head_run_at);
            UPDATE {schema}.soniq_key_slots AS k SET head = NULL, head_run_at = NULL
             WHERE k.queue = p_queue AND k.key = p_key;
        END IF;
    END IF;
    PERFORM {schema}.soniq_key_admit_v1(p_queue, p_key);
    RETURN v_id;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_key_limit_v1(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_key_admit_v1(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_key_moved_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_key_deferred_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_key_hold_gone_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_key_sweep() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_key_refresh(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_enqueue_keyed(text, integer, text, text, jsonb, text,
                                                    integer, timestamptz, integer, boolean,
                                                    text, text, uuid) FROM PUBLIC;
