-- soniq_django limits per key, the jobs that reach their key later (PostgreSQL):
-- a replayed dead letter, and a job that waits for others (depends_on).
--
-- Loaded by migration 0032_key_park after it added
-- soniq_dead_letter_jobs.concurrency_key; never edited once released. Its
-- reverse is key_park_v1.down.sql; the SQLite twin is sqlite/key_park_v1.sql.
-- See docs/keys.md and docs/decisions/0047-limits-per-key.md. The counting of
-- claim_protocol_v12.sql is unchanged: this file only parks more jobs under it.
--
-- * A keyed job's row deleted while a dead letter of the same id exists (the
--   move to the dead letters writes the dead letter first, then deletes the
--   job, whoever moves it) gives the dead letter its key. A replay
--   (replay.py) inserts the job back parked, with its key, and calls
--   soniq_key_park_v1: the key's limits (soniq_key_slots, soniq_key_limits)
--   hold for it again.
-- * soniq_enqueue_keyed_after: a keyed job that depends on others. It goes in
--   through soniq_enqueue_after (its checks, edges, waiting, cancellation) and
--   is not parked while it waits: a waiting job never is its key's head. When
--   its last dependency is done, soniq_settle_dependents_v2 (a copy of v1 that
--   differs in that one place) parks it under its key instead of making it due;
--   a dependency that fails cancels it as before, and its key's counts (it held
--   no slot and no place) stay as they were.

-- soniq_key_park_v1: put a queued keyed job under its key --
-- p_job: a queued row with concurrency_key set that no key holds yet (a
-- replayed dead letter, a released dependent); p_run_at: its own due time.
-- The row goes to 9999-01-01 (if it was not there), gets its soniq_key_parked
-- row, takes a head's place as an enqueue does (a more urgent due job, or a
-- due job or one due sooner than a head not yet due) and the key admits its
-- next job if it has room. Locks the key's soniq_key_slots row (made if the
-- key has none) as soniq_enqueue_keyed does. Anything else: nothing happens.
CREATE FUNCTION {schema}.soniq_key_park_v1(p_job uuid, p_run_at timestamptz) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_job record;
    v_slot record;
    v_head record;
    v_now timestamptz;
    v_gate text;
BEGIN
    SELECT j.queue, j.concurrency_key AS key, j.priority, j.created_at, j.scheduled_at
      INTO v_job FROM {schema}.soniq_jobs AS j
     WHERE j.id = p_job AND (j.status = 'queued' AND j.concurrency_key IS NOT NULL) IS TRUE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    INSERT INTO {schema}.soniq_key_slots AS k (queue, key, running, updated_at)
    VALUES (v_job.queue, v_job.key, 0, pg_catalog.clock_timestamp())
    ON CONFLICT ON CONSTRAINT soniq_key_slots_key DO NOTHING;
    SELECT k.head, k.head_run_at INTO v_slot FROM {schema}.soniq_key_slots AS k
     WHERE k.queue = v_job.queue AND k.key = v_job.key FOR UPDATE;
    IF v_slot.head = p_job OR EXISTS (SELECT 1 FROM {schema}.soniq_key_parked AS q
                                       WHERE q.job_id = p_job) THEN
        RETURN;  -- its key holds it already
    END IF;
    v_gate := pg_catalog.current_setting('soniq.fenced_write', true);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    IF v_job.scheduled_at IS DISTINCT FROM '9999-01-01 00:00:00+00'::timestamptz THEN
        UPDATE {schema}.soniq_jobs AS j
           SET scheduled_at = '9999-01-01 00:00:00+00'::timestamptz
         WHERE j.id = p_job;
    END IF;
    INSERT INTO {schema}.soniq_key_parked (job_id, queue, key, priority, created_at, run_at)
    VALUES (p_job, v_job.queue, v_job.key, v_job.priority, v_job.created_at, p_run_at);
    -- As soniq_enqueue_keyed: a more urgent due job takes a queued head's place; so
    -- does a due job, or one due sooner, the place of a head not yet due.
    IF v_slot.head IS NOT NULL THEN
        SELECT j.id, j.priority, j.created_at INTO v_head FROM {schema}.soniq_jobs AS j
         WHERE j.id = v_slot.head AND (j.status = 'queued') IS TRUE;  -- by primary key
        v_now := pg_catalog.clock_timestamp();
        IF FOUND AND (((p_run_at IS NULL OR p_run_at <= v_now)
                       AND (v_slot.head_run_at > v_now OR v_head.priority > v_job.priority))
                      OR (p_run_at > v_now AND v_slot.head_run_at > v_now
                          AND p_run_at < v_slot.head_run_at)) THEN
            UPDATE {schema}.soniq_jobs AS j
               SET scheduled_at = '9999-01-01 00:00:00+00'::timestamptz
             WHERE j.id = v_head.id;
            INSERT INTO {schema}.soniq_key_parked
                   (job_id, queue, key, priority, created_at, run_at)
            VALUES (v_head.id, v_job.queue, v_job.key, v_head.priority, v_head.created_at,
                    v_slot.head_run_at)
            ON CONFLICT (job_id) DO NOTHING;
            UPDATE {schema}.soniq_key_slots AS k SET head = NULL, head_run_at = NULL
             WHERE k.queue = v_job.queue AND k.key = v_job.key;
        END IF;
    END IF;
    PERFORM pg_catalog.set_config('soniq.fenced_write', coalesce(v_gate, 'off'), true);
    PERFORM {schema}.soniq_key_admit_v1(v_job.queue, v_job.key);
END
$fn$;

-- soniq_key_dead_letter_v1: a dead letter keeps its job's key --
CREATE FUNCTION {schema}.soniq_key_dead_letter_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    UPDATE {schema}.soniq_dead_letter_jobs AS d SET concurrency_key = OLD.concurrency_key
     WHERE d.id = OLD.id AND d.concurrency_key IS DISTINCT FROM OLD.concurrency_key;
    RETURN NULL;
END
$fn$;

CREATE TRIGGER soniq_key_dead_letter
    AFTER DELETE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.concurrency_key IS NOT NULL)
    EXECUTE FUNCTION {schema}.soniq_key_dead_letter_v1();

-- soniq_settle_dependents_v2: workflows_v1.sql's work list; a keyed dependent
-- whose last dependency is done is parked under its key (soniq_key_park_v1)
-- instead of made due. Everything else as in v1.
CREATE FUNCTION {schema}.soniq_settle_dependents_v2(
    p_id uuid, p_failed boolean, p_ttl interval
) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_work uuid[] := ARRAY[p_id];
    v_fail boolean[] := ARRAY[p_failed];
    v_i integer := 1;
    v_gate text;
    v_now timestamptz;
    v_pending integer;
    v_run_at timestamptz;
    v_queue text;
    v_key text;
    r record;
BEGIN
    v_gate := pg_catalog.current_setting('soniq.fenced_write', true);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    PERFORM pg_catalog.set_config('soniq.workflow_cascade', 'on', true);
    WHILE v_i <= pg_catalog.cardinality(v_work) LOOP
        FOR r IN
            WITH e AS (
                UPDATE {schema}.soniq_job_dependencies AS d
                   SET state = CASE WHEN v_fail[v_i] THEN 'failed' ELSE 'done' END
                 WHERE d.depends_on = v_work[v_i] AND d.state = 'waiting'
                RETURNING d.job_id, d.any_outcome)
            SELECT e.job_id, pg_catalog.bool_or(NOT e.any_outcome) AS needs_done,
                   pg_catalog.count(*)::integer AS n
              FROM e GROUP BY e.job_id ORDER BY e.job_id
        LOOP
            IF v_fail[v_i] AND r.needs_done THEN
                DELETE FROM {schema}.soniq_job_waits AS w WHERE w.job_id = r.job_id;
                CONTINUE WHEN NOT FOUND;  -- not waiting any more (cancelled already)
                v_now := pg_catalog.clock_timestamp();
                UPDATE {schema}.soniq_jobs AS j
                   SET status = 'cancelled',
                       last_error = 'dependency_failed:' || v_work[v_i]::text,
                       expires_at = v_now + p_ttl, updated_at = v_now
                 WHERE j.id = r.job_id AND j.status = 'queued';
                IF FOUND THEN
                    v_work := v_work || r.job_id;
                    v_fail := v_fail || true;
                END IF;
            ELSE
                UPDATE {schema}.soniq_job_waits AS w SET pending = w.pending - r.n
                 WHERE w.job_id = r.job_id
                RETURNING w.pending, w.run_at INTO v_pending, v_run_at;
                CONTINUE WHEN NOT FOUND OR v_pending > 0;
                DELETE FROM {schema}.soniq_job_waits AS w WHERE w.job_id = r.job_id;
                -- A keyed job stays at 9999-01-01: its key offers it (v2).
                UPDATE {schema}.soniq_jobs AS j
                   SET scheduled_at = CASE WHEN j.concurrency_key IS NULL THEN v_run_at
                                           ELSE j.scheduled_at END,
                       updated_at = pg_catalog.clock_timestamp()
                 WHERE j.id = r.job_id AND j.status = 'queued'
                RETURNING j.queue, j.concurrency_key INTO v_queue, v_key;
                IF FOUND AND v_key IS NOT NULL THEN
                    PERFORM {schema}.soniq_key_park_v1(r.job_id, v_run_at);
                ELSIF FOUND AND (v_run_at IS NULL OR v_run_at <= pg_catalog.now()) THEN
                    PERFORM pg_catalog.pg_notify('soniq_new_job', v_queue);
                END IF;
            END IF;
        END LOOP;
        v_i := v_i + 1;
    END LOOP;
    PERFORM pg_catalog.set_config('soniq.workflow_cascade', 'off', true);
    PERFORM pg_catalog.set_config('soniq.fenced_write', coalesce(v_gate, 'off'), true);
END
$fn$;

-- soniq_dependency_ended_v2: workflows_v1.sql's trigger function, calling v2 --
CREATE FUNCTION {schema}.soniq_dependency_ended_v2() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_ttl interval := interval '300 seconds';
BEGIN
    IF pg_catalog.current_setting('soniq.workflow_cascade', true) = 'on' THEN
        RETURN NULL;  -- a write of the work list: it settles this job itself
    END IF;
    IF TG_OP = 'DELETE' THEN
        PERFORM {schema}.soniq_settle_dependents_v2(OLD.id, true, v_ttl);
    ELSE
        -- Dependents it cancels are kept as long as the job that ended them.
        IF NEW.expires_at IS NOT NULL AND NEW.expires_at >= NEW.updated_at THEN
            v_ttl := NEW.expires_at - NEW.updated_at;
        END IF;
        PERFORM {schema}.soniq_settle_dependents_v2(NEW.id, NEW.status <> 'done', v_ttl);
    END IF;
    RETURN NULL;
END
$fn$;

DROP TRIGGER soniq_dependency_ended ON {schema}.soniq_jobs;
DROP TRIGGER soniq_dependency_gone ON {schema}.soniq_jobs;

CREATE TRIGGER soniq_dependency_ended
    AFTER UPDATE OF status ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND OLD.status IN ('queued', 'processing')
          AND NEW.status IN ('done', 'cancelled'))
    EXECUTE FUNCTION {schema}.soniq_dependency_ended_v2();

CREATE TRIGGER soniq_dependency_gone
    AFTER DELETE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.has_dependents AND OLD.status IN ('queued', 'processing'))
    EXECUTE FUNCTION {schema}.soniq_dependency_ended_v2();

-- soniq_enqueue_keyed_after: enqueue a keyed job that waits for others --
-- The key and its limits as soniq_enqueue_keyed takes them (same checks and
-- codes: SQLSTATE 22023, HINT SONIQ_INVALID_OPTION), then soniq_enqueue_after's
-- parameters, checks, codes and duplicate rules (it calls soniq_enqueue_after).
-- The limits become the key's configured ones. A job that waits is parked
-- under its key when its last dependency is done; one that waits for nothing
-- (every dependency done already) is parked at once; one whose dependency has
-- failed is cancelled, as soniq_enqueue_after does.
CREATE FUNCTION {schema}.soniq_enqueue_keyed_after(
    concurrency_key text,
    key_concurrency integer,
    key_rate text,
    depends_on uuid[],
    job_name text,
    args jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT 'default',
    priority integer DEFAULT 100,
    run_at timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT 4,
    unique_job boolean DEFAULT false,
    dedup_key text DEFAULT NULL,
    producer_id text DEFAULT NULL,
    job_id uuid DEFAULT NULL,
    any_outcome boolean DEFAULT false,
    result_ttl_seconds double precision DEFAULT 300
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_variable
DECLARE
    p_key text := soniq_enqueue_keyed_after.concurrency_key;
    p_queue text := coalesce(soniq_enqueue_keyed_after.queue, 'default');
    v_id uuid := coalesce(soniq_enqueue_keyed_after.job_id, pg_catalog.gen_random_uuid());
    v_found uuid;
    v_rate_limit integer;
    v_rate_period integer;
    v_match text[];
    v_status text;
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
    v_found := {schema}.soniq_enqueue_after(
        depends_on, job_name, args, p_queue, priority, run_at, max_attempts, unique_job,
        dedup_key, producer_id, v_id, any_outcome, result_ttl_seconds);
    IF v_found IS DISTINCT FROM v_id THEN
        RETURN v_found;  -- an equal queued job: nothing else changes
    END IF;
    UPDATE {schema}.soniq_jobs AS j SET concurrency_key = p_key WHERE j.id = v_id
    RETURNING j.status INTO v_status;
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
    IF v_status = 'queued' AND NOT EXISTS (SELECT 1 FROM {schema}.soniq_job_waits AS w
                                            WHERE w.job_id = v_id) THEN
        PERFORM {schema}.soniq_key_park_v1(v_id, run_at);  -- nothing to wait for
    END IF;
    RETURN v_id;
END
$fn$;

-- soniq_enqueue_keyed_many: many keyed jobs at once, set-based --
-- `jobs`: a JSON array of soniq_enqueue_many's elements, each with
-- "concurrency_key" (required) and optionally "key_concurrency" and "key_rate",
-- as soniq_enqueue_keyed takes them. Writes what one soniq_enqueue_keyed per
-- element in array order writes (tests/keys/test_key_bulk.py), in a few
-- statements for the whole array plus one admission per key: the key options
-- checked for every element first (22023, HINT SONIQ_INVALID_OPTION, the
-- element's position in DETAIL); the jobs through soniq_enqueue_many, parked
-- (its checks, codes, duplicates and all-or-nothing); for the new ones (not a
-- unique or dedup twin) their key, each key's configured limits (the last new
-- element's of the key win), their soniq_key_parked rows; then the keys' rows
-- locked in (queue, key) order, a head's place given to a new job by the
-- enqueue's rule, and each key's admission. Returns the ids in array order.
CREATE FUNCTION {schema}.soniq_enqueue_keyed_many(jobs jsonb) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_jobs jsonb := soniq_enqueue_keyed_many.jobs;
    v_position bigint;
    v_problem text;
    v_plain jsonb;
    v_meant uuid[];
    v_found uuid[];
    v_ids uuid[];
    v_queues text[];
    v_keys text[];
    v_run_ats timestamptz[];
    v_limits integer[];
    v_rate_limits integer[];
    v_rate_periods integer[];
    v_now timestamptz;
    r record;
BEGIN
    IF v_jobs IS NULL OR pg_catalog.jsonb_typeof(v_jobs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'jobs must be a JSON array of objects'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
    END IF;
    SELECT x.ord, CASE
             WHEN pg_catalog.jsonb_typeof(x.e) IS DISTINCT FROM 'object'
               THEN 'every element must be a JSON object'
             WHEN pg_catalog.jsonb_typeof(x.e -> 'concurrency_key') IS DISTINCT FROM 'string'
                  OR pg_catalog.length(x.e ->> 'concurrency_key') NOT BETWEEN 1 AND 255
               THEN 'concurrency_key must be a non-empty string of at most 255 characters'
             WHEN coalesce(pg_catalog.jsonb_typeof(x.e -> 'key_concurrency'), 'null') <> 'null'
                  AND (pg_catalog.jsonb_typeof(x.e -> 'key_concurrency') <> 'number'
                       OR (x.e ->> 'key_concurrency') !~ '^[1-9][0-9]{0,9}$'
                       OR (x.e ->> 'key_concurrency')::numeric > 2147483647)
               THEN 'key_concurrency must be a positive integer or NULL'
             WHEN coalesce(pg_catalog.jsonb_typeof(x.e -> 'key_rate'), 'null') <> 'null'
                  AND (pg_catalog.jsonb_typeof(x.e -> 'key_rate') <> 'string'
                       OR (x.e ->> 'key_rate') !~ '^[1-9][0-9]{0,8}/[smh]$')
               THEN 'key_rate must read N/s, N/m or N/h (N a positive integer)'
           END
      INTO v_position, v_problem
      FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS x(e, ord)
     WHERE pg_catalog.jsonb_typeof(x.e) IS DISTINCT FROM 'object'
        OR pg_catalog.jsonb_typeof(x.e -> 'concurrency_key') IS DISTINCT FROM 'string'
        OR pg_catalog.length(x.e ->> 'concurrency_key') NOT BETWEEN 1 AND 255
        OR (coalesce(pg_catalog.jsonb_typeof(x.e -> 'key_concurrency'), 'null') <> 'null'
            AND (pg_catalog.jsonb_typeof(x.e -> 'key_concurrency') <> 'number'
                 OR (x.e ->> 'key_concurrency') !~ '^[1-9][0-9]{0,9}$'
                 OR (x.e ->> 'key_concurrency')::numeric > 2147483647))
        OR (coalesce(pg_catalog.jsonb_typeof(x.e -> 'key_rate'), 'null') <> 'null'
            AND (pg_catalog.jsonb_typeof(x.e -> 'key_rate') <> 'string'
                 OR (x.e ->> 'key_rate') !~ '^[1-9][0-9]{0,8}/[smh]$'))
     ORDER BY x.ord LIMIT 1;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION '%', v_problem
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION',
                  DETAIL = pg_catalog.format('element %s of jobs', v_position);
    END IF;
    -- The jobs, parked, through soniq_enqueue_many; an id for each (the one meant).
    SELECT pg_catalog.jsonb_agg((x.e - 'concurrency_key' - 'key_concurrency' - 'key_rate'
                                 - 'run_at')
                                || pg_catalog.jsonb_build_object(
                                       'run_at', '9999-01-01T00:00:00+00:00',
                                       'job_id', CASE WHEN x.id IS NULL THEN x.e -> 'job_id'
                                                      ELSE pg_catalog.to_jsonb(x.id::text) END)
                                ORDER BY x.ord),
           pg_catalog.array_agg(x.id ORDER BY x.ord)
      INTO v_plain, v_meant
      FROM (SELECT y.e, y.ord,
                   CASE WHEN coalesce(pg_catalog.jsonb_typeof(y.e -> 'job_id'), 'null') = 'null'
                        THEN pg_catalog.gen_random_uuid() END AS id
              FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS y(e, ord)) AS x;
    IF v_plain IS NULL THEN
        RETURN '{}'::uuid[];
    END IF;
    v_found := {schema}.soniq_enqueue_many(v_plain);
    -- The new jobs (not a twin found in their place), in array order: id, queue, key,
    -- run_at, limits (rows of the arrays below; unnest(...) reads them back).
    SELECT pg_catalog.array_agg(v_found[x.ord] ORDER BY x.ord),
           pg_catalog.array_agg(coalesce(x.e ->> 'queue', 'default') ORDER BY x.ord),
           pg_catalog.array_agg(x.e ->> 'concurrency_key' ORDER BY x.ord),
           pg_catalog.array_agg((x.e ->> 'run_at')::timestamptz ORDER BY x.ord),
           pg_catalog.array_agg((x.e ->> 'key_concurrency')::integer ORDER BY x.ord),
           pg_catalog.array_agg(pg_catalog.split_part(x.e ->> 'key_rate', '/', 1)::integer
                                ORDER BY x.ord),
           pg_catalog.array_agg(CASE pg_catalog.split_part(x.e ->> 'key_rate', '/', 2)
                                     WHEN 's' THEN 1 WHEN 'm' THEN 60 WHEN 'h' THEN 3600 END
                                ORDER BY x.ord)
      INTO v_ids, v_queues, v_keys, v_run_ats, v_limits, v_rate_limits, v_rate_periods
      FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS x(e, ord)
     WHERE v_found[x.ord] = coalesce(v_meant[x.ord], (x.e ->> 'job_id')::uuid);
    IF v_ids IS NULL THEN
        RETURN v_found;  -- every one found an equal queued job: nothing else changes
    END IF;
    UPDATE {schema}.soniq_jobs AS j SET concurrency_key = n.key
      FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_keys)) AS n(id, key)
     WHERE j.id = n.id;
    -- Each key's configured limits: its last new element's.
    INSERT INTO {schema}.soniq_key_slots AS k
           (queue, key, running, configured_concurrency, configured_rate_limit,
            configured_rate_period, updated_at)
    SELECT DISTINCT ON (n.queue, n.key) n.queue, n.key, 0, n.lim, n.rl, n.rp,
           pg_catalog.clock_timestamp()
      FROM ROWS FROM (pg_catalog.unnest(v_queues), pg_catalog.unnest(v_keys),
                      pg_catalog.unnest(v_limits), pg_catalog.unnest(v_rate_limits),
                      pg_catalog.unnest(v_rate_periods)) WITH ORDINALITY
           AS n(queue, key, lim, rl, rp, ord)
     ORDER BY n.queue, n.key, n.ord DESC
    ON CONFLICT ON CONSTRAINT soniq_key_slots_key DO UPDATE
       SET configured_concurrency = EXCLUDED.configured_concurrency,
           configured_rate_limit = EXCLUDED.configured_rate_limit,
           configured_rate_period = EXCLUDED.configured_rate_period
     WHERE (k.configured_concurrency, k.configured_rate_limit, k.configured_rate_period)
           IS DISTINCT FROM (EXCLUDED.configured_concurrency, EXCLUDED.configured_rate_limit,
                             EXCLUDED.configured_rate_period);
    PERFORM 1 FROM {schema}.soniq_key_slots AS k
      JOIN (SELECT DISTINCT d.queue, d.key
              FROM ROWS FROM (pg_catalog.unnest(v_queues), pg_catalog.unnest(v_keys))
                   AS d(queue, key)) AS d
        ON k.queue = d.queue AND k.key = d.key
     ORDER BY k.queue, k.key FOR UPDATE OF k;
    -- In array order: jobs of equal priority and age are offered in the order written.
    INSERT INTO {schema}.soniq_key_parked (job_id, queue, key, priority, created_at, run_at)
    SELECT n.id, n.queue, n.key, j.priority, j.created_at, n.run_at
      FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_queues),
                      pg_catalog.unnest(v_keys), pg_catalog.unnest(v_run_ats)) WITH ORDINALITY
           AS n(id, queue, key, run_at, ord)
      JOIN {schema}.soniq_jobs AS j ON j.id = n.id
     ORDER BY n.ord;
    -- A head's place, by soniq_enqueue_keyed's rule, to any new job of its key.
    v_now := pg_catalog.clock_timestamp();
    FOR r IN
        SELECT k.queue, k.key, k.head, k.head_run_at, h.priority, h.created_at
          FROM {schema}.soniq_key_slots AS k
          JOIN {schema}.soniq_jobs AS h ON h.id = k.head AND (h.status = 'queued') IS TRUE
         WHERE EXISTS (SELECT 1
                         FROM ROWS FROM (pg_catalog.unnest(v_ids), pg_catalog.unnest(v_queues),
                                         pg_catalog.unnest(v_keys),
                                         pg_catalog.unnest(v_run_ats))
                              AS n(id, queue, key, run_at)
                         JOIN {schema}.soniq_jobs AS j ON j.id = n.id
                        WHERE n.queue = k.queue AND n.key = k.key
                          AND (((n.run_at IS NULL OR n.run_at <= v_now)
                                AND (k.head_run_at > v_now OR h.priority > j.priority))
                               OR (n.run_at > v_now AND k.head_run_at > v_now
                                   AND n.run_at < k.head_run_at)))
         ORDER BY k.queue, k.key
    LOOP
        PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
        UPDATE {schema}.soniq_jobs AS j
           SET scheduled_at = '9999-01-01 00:00:00+00'::timestamptz
         WHERE j.id = r.head;
        PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
        INSERT INTO {schema}.soniq_key_parked (job_id, queue, key, priority, created_at, run_at)
        VALUES (r.head, r.queue, r.key, r.priority, r.created_at, r.head_run_at)
        ON CONFLICT (job_id) DO NOTHING;
        UPDATE {schema}.soniq_key_slots AS k SET head = NULL, head_run_at = NULL
         WHERE k.queue = r.queue AND k.key = r.key;
    END LOOP;
    FOR r IN SELECT DISTINCT d.queue, d.key
               FROM ROWS FROM (pg_catalog.unnest(v_queues), pg_catalog.unnest(v_keys))
                    AS d(queue, key)
              ORDER BY d.queue, d.key LOOP
        PERFORM {schema}.soniq_key_admit_v1(r.queue, r.key);
    END LOOP;
    RETURN v_found;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_key_park_v1(uuid, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_key_dead_letter_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_settle_dependents_v2(uuid, boolean, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_dependency_ended_v2() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_enqueue_keyed_many(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_enqueue_keyed_after(text, integer, text, uuid[], text,
    jsonb, text, integer, timestamptz, integer, boolean, text, text, uuid, boolean,
    double precision) FROM PUBLIC;
