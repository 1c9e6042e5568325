-- soniq_django workflows, version 1 (PostgreSQL): dependencies settled in the
-- transaction of the write that ends a job, whoever writes it.
--
-- Loaded by migration 0025_workflows after it added soniq_jobs.has_dependents
-- and the tables soniq_job_dependencies and soniq_job_waits; never edited
-- once released. Its reverse is workflows_v1.down.sql. The SQLite twin is
-- sqlite/workflows_v1.sql. See docs/decisions/0044-workflows.md.
--
-- A job that waits for others (soniq_enqueue_after, producer_api_v5.sql) is
-- an ordinary queued row scheduled at 9999-01-01 UTC, with one
-- soniq_job_dependencies row per job it names and a soniq_job_waits row that
-- counts the edges still waiting and keeps its own run_at. The jobs it names
-- carry has_dependents = true. When such a job ends -- done, cancelled, or
-- gone from soniq_jobs while unfinished (the move to the dead letters, a
-- delete) -- the trigger below settles its edges in that same transaction,
-- whether the write came from soniq_complete_many, soniq_fail, a reaper, a
-- cancel, or a worker that knows nothing of workflows (Soniq 0.1/0.2's own
-- UPDATE, a program following docs/claim-protocol.md):
--
-- * done: each waiting edge becomes 'done' and its dependent's counter goes
--   down by one (UPDATE ... RETURNING on the soniq_job_waits row: the row
--   lock orders concurrent completions, so exactly one of them sees the
--   count reach 0). At 0 the dependent's waits row is deleted and its
--   scheduled_at set back to its own run_at: it is claimable from the
--   commit on, and soniq_new_job is notified for its queue.
-- * cancelled or gone: each waiting edge becomes 'failed'. A dependent that
--   needed it done (any_outcome false) and still waits is cancelled, with
--   last_error 'dependency_failed:<id of this job>', and is settled in turn
--   (a work list, not trigger recursion: a chain of any length ends in one
--   call). A dependent that waits for any outcome (a batch's callback)
--   counts it as finished, as for done.
--
-- A plain job (has_dependents NULL) never calls the function: the triggers'
-- WHEN clauses stop it, so the usual life of a job costs nothing here.

-- soniq_settle_dependents_v1: the work list (internal; called by the trigger) --
CREATE FUNCTION {schema}.soniq_settle_dependents_v1(
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
    r record;
BEGIN
    v_gate := pg_catalog.current_setting('soniq.fenced_write', true);
    -- The writes below end or release other jobs: through the protection
    -- trigger's gate, and with the cascade flag that keeps the trigger from
    -- settling them a second time (this list does).
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
                UPDATE {schema}.soniq_jobs AS j
                   SET scheduled_at = v_run_at, updated_at = pg_catalog.clock_timestamp()
                 WHERE j.id = r.job_id AND j.status = 'queued'
                RETURNING j.queue INTO v_queue;
                IF FOUND AND (v_run_at IS NULL OR v_run_at <= pg_catalog.now()) THEN
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

-- soniq_dependency_ended_v1: the trigger function --
CREATE FUNCTION {schema}.soniq_dependency_ended_v1() RETURNS trigger
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
        PERFORM {schema}.soniq_settle_dependents_v1(OLD.id, true, v_ttl);
    ELSE
        -- Dependents it cancels are kept as long as the job that ended them.
        IF NEW.expires_at IS NOT NULL AND NEW.expires_at >= NEW.updated_at THEN
            v_ttl := NEW.expires_at - NEW.updated_at;
        END IF;
        PERFORM {schema}.soniq_settle_dependents_v1(NEW.id, NEW.status <> 'done', v_ttl);
    END IF;
    RETURN NULL;
END
$fn$;

-- soniq_dependent_guard_v1: a waiting job stays at its far-off time --
CREATE FUNCTION {schema}.soniq_dependent_guard_v1() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    -- A write that would make a waiting job due ("retry now", a hand-made
    -- UPDATE) keeps it waiting; the time it asked for is kept for its release.
    UPDATE {schema}.soniq_job_waits AS w SET run_at = NEW.scheduled_at
     WHERE w.job_id = OLD.id AND w.pending > 0;
    IF FOUND THEN
        NEW.scheduled_at := OLD.scheduled_at;
    END IF;
    RETURN NEW;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_settle_dependents_v1(uuid, boolean, interval) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_dependency_ended_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_dependent_guard_v1() FROM PUBLIC;

CREATE TRIGGER soniq_dependency_ended
    AFTER UPDATE OF status ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (NEW.has_dependents AND OLD.status IN ('queued', 'processing')
          AND NEW.status IN ('done', 'cancelled'))
    EXECUTE FUNCTION {schema}.soniq_dependency_ended_v1();

CREATE TRIGGER soniq_dependency_gone
    AFTER DELETE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.has_dependents AND OLD.status IN ('queued', 'processing'))
    EXECUTE FUNCTION {schema}.soniq_dependency_ended_v1();

CREATE TRIGGER soniq_dependent_guard
    BEFORE UPDATE OF scheduled_at ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.scheduled_at = '9999-01-01 00:00:00+00'::timestamptz
          AND NEW.scheduled_at IS DISTINCT FROM OLD.scheduled_at)
    EXECUTE FUNCTION {schema}.soniq_dependent_guard_v1();
