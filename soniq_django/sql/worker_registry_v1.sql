-- soniq_django worker registry, version 1 (PostgreSQL). Loaded by migration
-- 0030_worker_registry; never edited once released. Its reverse is
-- worker_registry_v1.down.sql. See docs/decisions/0048-workers-in-any-language.md
-- and docs/claim-protocol.md.
--
-- A worker in any language registers itself and the job names it handles
-- through two functions, so that it needs EXECUTE and no right on
-- soniq_workers or soniq_task_registry (soniq_grant --worker). soniq_django's
-- own worker calls the same two on PostgreSQL (worker/registration.py), so
-- one rule decides who is live: an 'active' row whose last_heartbeat is
-- within the live window (three heartbeats, at least a minute) by the
-- database's clock. A Python worker with no handler for a job's name defers
-- it, instead of dead-lettering it as job_not_found, while such a worker
-- serving the job's queue registered the name (worker/unknown.py).
--
-- Times are clock_timestamp(): the database's, so no host's clock is compared
-- with another's.
--
-- soniq_claim_outcome settles an uncertain final write: after a COMMIT whose
-- answer was lost, it says what became of one claim, and compares the nonce
-- the caller sends with the stored one without ever returning a token.

-- soniq_register_worker --
-- Insert or revive the worker's row as 'active' and replace its registered
-- job names with p_job_names (p_max_attempts[i], when given, is the attempt
-- limit of p_job_names[i] for jobs whose own max_attempts is NULL). Host and
-- pid default to the client's address and this session's backend pid. As in
-- Soniq, a (host, pid) has one row: an older row of the same pair under
-- another id is released first (its jobs keep their history, worker_id
-- NULL), as worker/registration.py does.
CREATE FUNCTION {schema}.soniq_register_worker(
    p_worker_id uuid, p_queues text[], p_job_names text[],
    p_host text DEFAULT NULL, p_pid integer DEFAULT NULL, p_label text DEFAULT NULL,
    p_max_attempts integer[] DEFAULT NULL, p_concurrency integer DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_host text := coalesce(p_host, pg_catalog.host(pg_catalog.inet_client_addr()), 'local');
    v_pid integer := coalesce(p_pid, pg_catalog.pg_backend_pid());
    v_queues text[] := coalesce(p_queues, '{}'::text[]);
    v_names text[] := coalesce(p_job_names, '{}'::text[]);
    v_older uuid[];
    v_now timestamptz;
    v_try integer;
BEGIN
    IF p_worker_id IS NULL
       OR v_host = '' OR pg_catalog.length(v_host) > 255 OR v_pid < 1
       OR pg_catalog.length(p_label) > 255
       OR (p_concurrency IS NOT NULL AND p_concurrency < 1)
       OR pg_catalog.cardinality(v_queues) > 1000 OR pg_catalog.array_ndims(v_queues) > 1
       OR EXISTS (SELECT 1 FROM pg_catalog.unnest(v_queues) AS q
                   WHERE q IS NULL OR q = '' OR pg_catalog.length(q) > 255)
       OR pg_catalog.cardinality(v_names) > 10000 OR pg_catalog.array_ndims(v_names) > 1
       OR EXISTS (SELECT 1 FROM pg_catalog.unnest(v_names) AS n
                   WHERE n IS NULL OR n = '' OR pg_catalog.length(n) > 1000)
       OR (SELECT pg_catalog.count(DISTINCT n) FROM pg_catalog.unnest(v_names) AS n)
          <> pg_catalog.cardinality(v_names)
       OR (p_max_attempts IS NOT NULL AND (
              pg_catalog.cardinality(p_max_attempts) <> pg_catalog.cardinality(v_names)
              OR pg_catalog.array_ndims(p_max_attempts) > 1
              OR EXISTS (SELECT 1 FROM pg_catalog.unnest(p_max_attempts) AS m WHERE m < 1))) THEN
        RAISE EXCEPTION 'invalid worker registration'
            USING ERRCODE = '22023', HINT = 'CONFIG',
                  DETAIL = 'a worker id; host, label and queue names of 1 to 255 characters; '
                           'distinct job names of 1 to 1000; pid, concurrency and attempt '
                           'limits >= 1, one limit per name';
    END IF;
    FOR v_try IN 1 .. 3 LOOP
        BEGIN
            SELECT pg_catalog.array_agg(o.id) INTO v_older
              FROM (SELECT w.id FROM {schema}.soniq_workers AS w
                     WHERE w.hostname = v_host AND w.pid = v_pid AND w.id <> p_worker_id
                       FOR UPDATE) AS o;
            IF v_older IS NOT NULL THEN
                -- Only the informational worker_id of owned rows changes: the
                -- protection trigger lets it through under the fenced-write flag.
                PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
                UPDATE {schema}.soniq_jobs AS j SET worker_id = NULL
                 WHERE j.worker_id = ANY (v_older);
                PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
                DELETE FROM {schema}.soniq_task_registry AS r
                 WHERE r.worker_id = ANY (v_older::text[]);
                DELETE FROM {schema}.soniq_workers AS w WHERE w.id = ANY (v_older);
            END IF;
            v_now := pg_catalog.clock_timestamp();  -- after the locks
            INSERT INTO {schema}.soniq_workers AS w
                (id, hostname, pid, queues, concurrency, status, last_heartbeat, started_at,
                 version, metadata)
            VALUES (p_worker_id, v_host, v_pid, v_queues, coalesce(p_concurrency, 1), 'active',
                    v_now, v_now, p_label, '{}'::jsonb)
            ON CONFLICT (id) DO UPDATE
               SET hostname = EXCLUDED.hostname, pid = EXCLUDED.pid, queues = EXCLUDED.queues,
                   concurrency = EXCLUDED.concurrency, status = 'active',
                   last_heartbeat = EXCLUDED.last_heartbeat, started_at = EXCLUDED.started_at,
                   version = EXCLUDED.version;
            EXIT;
        EXCEPTION WHEN unique_violation THEN
            -- Another registration of the same (host, pid) committed between
            -- our look and our insert: look again.
            IF v_try = 3 THEN
                RAISE;
            END IF;
        END;
    END LOOP;
    DELETE FROM {schema}.soniq_task_registry AS r
     WHERE r.worker_id = p_worker_id::text AND NOT (r.task_name = ANY (v_names));
    INSERT INTO {schema}.soniq_task_registry AS r
        (task_name, worker_id, last_seen_at, max_attempts)
    SELECT n.name, p_worker_id::text, v_now, p_max_attempts[n.i]
      FROM pg_catalog.unnest(v_names) WITH ORDINALITY AS n (name, i)
    ON CONFLICT (task_name, worker_id) DO UPDATE
       SET last_seen_at = EXCLUDED.last_seen_at, max_attempts = EXCLUDED.max_attempts;
END
$fn$;

-- soniq_worker_heartbeat --
-- Record that the worker is alive, and its state: 'active' (claiming),
-- 'stopping' (draining: peers no longer count on it) or 'stopped' (gone;
-- send it last). True when written; false when the worker has no row or a
-- 'stopped' one: register again before claiming more.
CREATE FUNCTION {schema}.soniq_worker_heartbeat(
    p_worker_id uuid, p_status text DEFAULT 'active'
) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF p_worker_id IS NULL OR p_status IS NULL
       OR p_status NOT IN ('active', 'stopping', 'stopped') THEN
        RAISE EXCEPTION 'invalid worker heartbeat'
            USING ERRCODE = '22023', HINT = 'CONFIG',
                  DETAIL = 'a worker id, and a status of active, stopping or stopped';
    END IF;
    UPDATE {schema}.soniq_workers AS w
       SET last_heartbeat = pg_catalog.clock_timestamp(), status = p_status
     WHERE w.id = p_worker_id AND w.status <> 'stopped';
    RETURN FOUND;
END
$fn$;

-- soniq_claim_outcome --
-- What became of one claim, for a worker that does not know whether its
-- last write committed. Locks the job's row first, so a transaction of the
-- same claim still committing is waited for (bound it with lock_timeout).
-- outcome:
--   live       still processing under this exact fence, lease running: your
--              final write did not commit; send it again (or your handler's
--              transaction, whole);
--   lapsed     processing under this fence, lease run out, not yet settled:
--              nothing you send will apply;
--   completed  done under this exact fence: your soniq_complete committed;
--   cancelled  cancelled while this claim held it (acknowledged, a cancel
--              after the lapse, or superseded by a queued twin);
--   failed, lapsed, deferred or dead: the attempt ended without finishing
--              the job, as soniq_job_attempts recorded it for this worker id
--              and generation (failed: a soniq_fail that queued it again;
--              lapsed: its lease ran out and a reaper settled it; dead: it
--              went to the dead letters);
--   unknown    no trace of this claim (a wrong fence, or the rows purged).
-- The stored nonce must match while the row still carries the generation;
-- after a later claim or the move to the dead letters the row no longer
-- holds it, and an ended attempt is found by worker id and generation.
-- status is the job's status now ('dead_letter' when it is there, NULL when
-- gone) and generation its current claim generation (NULL when not in
-- soniq_jobs). The stored nonce is compared, never returned.
CREATE FUNCTION {schema}.soniq_claim_outcome(
    job_id text, worker_id text, generation bigint, claim_token text
) RETURNS TABLE (outcome text, status text, current_generation bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_job uuid;
    r record;
    v_now timestamptz;
    v_found boolean;
    v_mine boolean := false;
    v_attempt text;
BEGIN
    PERFORM {schema}.soniq_check_identity_v1(soniq_claim_outcome.worker_id, 'worker_id');
    PERFORM {schema}.soniq_check_identity_v1(soniq_claim_outcome.claim_token, 'claim_token');
    IF soniq_claim_outcome.generation IS NULL OR soniq_claim_outcome.generation < 1
       OR soniq_claim_outcome.job_id IS NULL THEN
        RAISE EXCEPTION 'invalid fence' USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    p_job := soniq_claim_outcome.job_id::uuid;
    SELECT j.status, j.claim_generation, j.claim_owner, j.claim_token, j.lease_expires_at
      INTO r
      FROM {schema}.soniq_jobs AS j
     WHERE j.id = p_job
       FOR UPDATE;
    v_found := FOUND;
    v_now := pg_catalog.clock_timestamp();  -- after the lock
    IF v_found THEN
        v_mine := r.claim_generation = soniq_claim_outcome.generation
                  AND r.claim_owner COLLATE "C" = soniq_claim_outcome.worker_id COLLATE "C"
                  AND r.claim_token COLLATE "C" = soniq_claim_outcome.claim_token COLLATE "C";
        IF v_mine AND r.status = 'processing' THEN
            outcome := CASE WHEN r.lease_expires_at > v_now THEN 'live' ELSE 'lapsed' END;
        ELSIF v_mine AND r.status = 'done' THEN
            outcome := 'completed';
        ELSIF v_mine AND r.status = 'cancelled' THEN
            outcome := 'cancelled';
        END IF;
        status := r.status;
        current_generation := r.claim_generation;
    ELSIF EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d WHERE d.id = p_job) THEN
        status := 'dead_letter';
    END IF;
    -- While the row still carries this generation, its nonce is the proof;
    -- once claimed again (or dead-lettered) the nonce is gone with it, and
    -- the attempt history names the claim by worker id and generation.
    IF outcome IS NULL AND NOT (v_found AND r.claim_generation = soniq_claim_outcome.generation
                                AND NOT v_mine) THEN
        SELECT a.outcome INTO v_attempt
          FROM {schema}.soniq_job_attempts AS a
         WHERE a.job_id = p_job
           AND a.generation = soniq_claim_outcome.generation
           AND a.claim_owner COLLATE "C" = soniq_claim_outcome.worker_id COLLATE "C"
         ORDER BY a.id DESC
         LIMIT 1;
        outcome := v_attempt;
    END IF;
    outcome := coalesce(outcome, 'unknown');
    RETURN NEXT;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_register_worker(uuid, text[], text[], text, integer, text, integer[], integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_worker_heartbeat(uuid, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_claim_outcome(text, text, bigint, text) FROM PUBLIC;
