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

REVOKE ALL ON FUNCTION {schema}.soniq_key_park_v1(uuid, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_key_dead_letter_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_settle_dependents_v2(uuid, boolean, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_dependency_ended_v2() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_enqueue_keyed_after(text, integer, text, uuid[], text,
    jsonb, text, integer, timestamptz, integer, boolean, text, text, uuid, boolean,
    double precision) FROM PUBLIC;
