-- soniq_django producer API, version 4 (PostgreSQL only): a plain job is
-- checked by one IF and written by one INSERT.
--
-- Loaded by migration 0017_producer_api_v4 with {schema} replaced by the
-- quoted schema that holds the soniq tables; producer_api_v4.down.sql and
-- the released body of producer_api_v3.sql put version 3 back. Never edited
-- once released.
--
-- Only soniq_enqueue's body changes. Its signature, defaults, grants,
-- results, SQLSTATEs, HINTs, messages, the order in which its checks fire
-- when several inputs are bad, and the trust model are version 3's (see
-- producer_api_v2.sql and producer_api_v3.sql). soniq_enqueue_many is not
-- re-created: it calls soniq_enqueue by name for its unique and dedup jobs,
-- so it gets this body.
--
-- Version 4. Version 3 ran, for every job, a query for the pattern (a join
-- of pg_db_role_setting with unnest(setconfig)), a DECLARE block of fourteen
-- variables, eight IF statements, a loop, the INSERT and a PERFORM of
-- pg_notify: three queries and some twenty expressions for a plain job.
-- Version 4 reads the database's setconfig by itself (one row:
-- pg_db_role_setting is unique on setdatabase, setrole) and looks for the
-- pattern in it by a plpgsql loop, which runs only when the database has
-- settings, in array order, so it finds the element version 3's unnest ...
-- LIMIT 1 found. Then one IF holds every check version 3 makes, written so
-- that it is true only when all of them pass and the job is a plain one (not
-- unique, no dedup_key, no job_id); then one INSERT ... VALUES writes the
-- job and, in its RETURNING, notifies: two queries in all. Any other call --
-- an invalid input, a NULL where version 3 substitutes a default (queue,
-- unique_job) or allows one (max_attempts), args of 315 bytes of text or
-- more, a unique, dedup or job_id job -- fails the IF and runs version 3's
-- body, unchanged but for the pattern it already has. So a refused call gets
-- version 3's error from version 3's code. The only error the IF itself can
-- raise is the pattern's (not a valid regular expression), and only for a
-- non-NULL job_name (the match is strict and comes first), which version 3
-- matches against the pattern first too.
-- docs/decisions/0027-plain-enqueue-fast-path.md has the measurements.
--
-- The database's own settings, "Why short args skip the scans" and the
-- trust model: as in producer_api_v2.sql. The pattern is the
-- database-level setting in pg_db_role_setting (setrole 0) of the database
-- whose oid is the next-to-last component of pg_proc's file path; a SET,
-- set_config or ALTER ROLE ... SET does not change it.

CREATE OR REPLACE FUNCTION {schema}.soniq_enqueue(
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
#variable_conflict use_column
DECLARE
    v_found uuid;
    v_config text[];
    v_setting text;
    v_pattern text;
BEGIN
    -- The database-level settings, then the pattern among them (see
    -- "Version 4" above).
    SELECT s.setconfig INTO v_config
      FROM pg_catalog.pg_db_role_setting AS s
     WHERE s.setrole = 0
       AND s.setdatabase = pg_catalog.substring(
               pg_catalog.pg_relation_filepath('pg_catalog.pg_proc'::pg_catalog.regclass),
               '([0-9]+)/[0-9]+$')::pg_catalog.oid;
    IF v_config IS NOT NULL THEN
        FOREACH v_setting IN ARRAY v_config LOOP
            IF pg_catalog.starts_with(v_setting, 'soniq.task_name_pattern=') THEN
                v_pattern := pg_catalog.substr(
                    v_setting, pg_catalog.length('soniq.task_name_pattern=') + 1);
                EXIT;
            END IF;
        END LOOP;
    END IF;

    -- A plain job that passes every check: one IF, then one INSERT that also
    -- notifies. The IF is version 3's checks in version 3's order, each as
    -- the condition for passing it; NULL (from a NULL input) counts as failing.
    -- pg_column_size, before the args are written out as text, only spares
    -- large args that conversion (they run version 3's body, which makes it
    -- once): args under 315 bytes of text that take 1024 bytes or more as
    -- jsonb are not refused either, they take that path too.
    IF soniq_enqueue.job_name
           ~ coalesce(v_pattern, E'^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$')
       AND pg_catalog.jsonb_typeof(soniq_enqueue.args) = 'object'
       AND pg_catalog.pg_column_size(soniq_enqueue.args) < 1024
       AND pg_catalog.octet_length(soniq_enqueue.args::text) < 315
       AND soniq_enqueue.max_attempts >= 1
       AND pg_catalog.length(soniq_enqueue.queue) BETWEEN 1 AND 255
       AND (soniq_enqueue.producer_id IS NULL
            OR pg_catalog.length(soniq_enqueue.producer_id) BETWEEN 1 AND 255)
       AND soniq_enqueue.job_id IS NULL
       AND NOT soniq_enqueue.unique_job
       AND soniq_enqueue.dedup_key IS NULL THEN
        INSERT INTO {schema}.soniq_jobs AS j
            (id, job_name, args, args_hash, status, attempts, max_attempts, queue,
             priority, unique_job, dedup_key, scheduled_at, producer_id)
        VALUES (pg_catalog.gen_random_uuid(), soniq_enqueue.job_name, soniq_enqueue.args, NULL,
                'queued', 0, soniq_enqueue.max_attempts, soniq_enqueue.queue,
                coalesce(soniq_enqueue.priority, 100), false, NULL, soniq_enqueue.run_at,
                coalesce(soniq_enqueue.producer_id,
                         NULLIF(pg_catalog.current_setting('application_name'), ''),
                         session_user))
        RETURNING j.id,
                  -- Wakes idle workers at commit, as version 3's PERFORM did.
                  CASE WHEN soniq_enqueue.run_at IS NULL
                            OR soniq_enqueue.run_at <= pg_catalog.now()
                       THEN pg_catalog.pg_notify('soniq_new_job', soniq_enqueue.queue) END
             INTO v_found;
        RETURN v_found;
    END IF;

    -- Every other call: version 3's body, with the pattern read above.
    DECLARE
        v_job_name text := soniq_enqueue.job_name;
        v_args jsonb := soniq_enqueue.args;
        v_queue text := coalesce(soniq_enqueue.queue, 'default');
        v_priority integer := coalesce(soniq_enqueue.priority, 100);
        v_run_at timestamptz := soniq_enqueue.run_at;
        v_max_attempts integer := soniq_enqueue.max_attempts;
        v_unique boolean := coalesce(soniq_enqueue.unique_job, false);
        v_dedup text := soniq_enqueue.dedup_key;
        v_producer text := soniq_enqueue.producer_id;
        v_id uuid := coalesce(soniq_enqueue.job_id, pg_catalog.gen_random_uuid());
        v_hash text;
        v_constraint text;
    BEGIN
        IF v_job_name IS NULL
           OR v_job_name !~ coalesce(v_pattern, E'^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$') THEN
            RAISE EXCEPTION 'job name does not match the task-name pattern'
                USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_TASK_NAME';
        END IF;
        IF v_args IS NULL OR pg_catalog.jsonb_typeof(v_args) IS DISTINCT FROM 'object' THEN
            RAISE EXCEPTION 'job args must be a JSON object'
                USING ERRCODE = '22023', HINT = 'SONIQ_TASK_ARGS_INVALID';
        END IF;
        -- The nesting and number scans cannot fire below 315 bytes of text: see
        -- "Why short args skip the scans" at the top of producer_api_v2.sql.
        IF pg_catalog.octet_length(v_args::text) >= 315 THEN
            PERFORM {schema}.soniq_check_args_v1(v_args);
        END IF;
        IF v_max_attempts IS NOT NULL AND v_max_attempts < 1 THEN
            RAISE EXCEPTION 'max_attempts must be at least 1'
                USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_MAX_ATTEMPTS';
        END IF;
        IF v_queue = '' OR pg_catalog.length(v_queue) > 255 THEN
            RAISE EXCEPTION 'queue must be 1 to 255 characters'
                USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
        END IF;
        IF v_dedup = '' OR pg_catalog.length(v_dedup) > 255 THEN
            RAISE EXCEPTION 'dedup_key must be 1 to 255 characters'
                USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
        END IF;
        IF v_producer = '' OR pg_catalog.length(v_producer) > 255 THEN
            RAISE EXCEPTION 'producer_id must be 1 to 255 characters'
                USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
        END IF;
        v_producer := coalesce(
            v_producer, NULLIF(pg_catalog.current_setting('application_name'), ''), session_user);
        -- An id is taken while either table holds it: a dead-lettered job keeps
        -- its id (and may be replayed under it).
        IF soniq_enqueue.job_id IS NOT NULL AND EXISTS (
            SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d WHERE d.id = soniq_enqueue.job_id)
        THEN
            RAISE EXCEPTION 'duplicate key value: the job id is held by a dead-lettered job'
                USING ERRCODE = '23505', CONSTRAINT = 'soniq_dead_letter_jobs_pkey';
        END IF;
        IF v_unique THEN
            v_hash := pg_catalog.encode(
                pg_catalog.sha256(pg_catalog.convert_to(
                    {schema}.soniq_canonical_json_v1(v_args), 'UTF8')),
                'hex');
        END IF;

        FOR attempt IN 1..10 LOOP
            v_found := NULL;
            IF v_dedup IS NULL AND NOT v_unique THEN
                INSERT INTO {schema}.soniq_jobs AS j
                    (id, job_name, args, args_hash, status, attempts, max_attempts, queue,
                     priority, unique_job, dedup_key, scheduled_at, producer_id)
                VALUES (v_id, v_job_name, v_args, NULL, 'queued', 0, v_max_attempts, v_queue,
                        v_priority, false, NULL, v_run_at, v_producer)
                RETURNING j.id INTO v_found;
            ELSIF NOT v_unique THEN
                INSERT INTO {schema}.soniq_jobs AS j
                    (id, job_name, args, args_hash, status, attempts, max_attempts, queue,
                     priority, unique_job, dedup_key, scheduled_at, producer_id)
                VALUES (v_id, v_job_name, v_args, NULL, 'queued', 0, v_max_attempts, v_queue,
                        v_priority, false, v_dedup, v_run_at, v_producer)
                ON CONFLICT (dedup_key) WHERE status = 'queued' AND dedup_key IS NOT NULL DO NOTHING
                RETURNING j.id INTO v_found;
            ELSIF v_dedup IS NULL THEN
                INSERT INTO {schema}.soniq_jobs AS j
                    (id, job_name, args, args_hash, status, attempts, max_attempts, queue,
                     priority, unique_job, dedup_key, scheduled_at, producer_id)
                VALUES (v_id, v_job_name, v_args, v_hash, 'queued', 0, v_max_attempts, v_queue,
                        v_priority, true, NULL, v_run_at, v_producer)
                -- "AND unique_job" also infers Soniq's own index, whose predicate has it.
                ON CONFLICT (job_name, args_hash) WHERE status = 'queued' AND unique_job = true
                DO NOTHING
                RETURNING j.id INTO v_found;
            ELSE
                -- Unique and deduplicated: ON CONFLICT takes one arbiter, so a
                -- clash on the other index arrives as unique_violation.
                BEGIN
                    INSERT INTO {schema}.soniq_jobs AS j
                        (id, job_name, args, args_hash, status, attempts, max_attempts, queue,
                         priority, unique_job, dedup_key, scheduled_at, producer_id)
                    VALUES (v_id, v_job_name, v_args, v_hash, 'queued', 0, v_max_attempts, v_queue,
                            v_priority, true, v_dedup, v_run_at, v_producer)
                    ON CONFLICT (dedup_key) WHERE status = 'queued' AND dedup_key IS NOT NULL
                    DO NOTHING
                    RETURNING j.id INTO v_found;
                EXCEPTION WHEN unique_violation THEN
                    GET STACKED DIAGNOSTICS v_constraint = CONSTRAINT_NAME;
                    -- Ours, or the same index as Soniq itself names it.
                    IF v_constraint IS NULL OR v_constraint NOT IN
                       ('soniq_jobs_unique_queued', 'idx_soniq_jobs_unique_queued') THEN
                        RAISE;
                    END IF;
                END;
            END IF;

            IF v_found IS NOT NULL THEN
                IF v_run_at IS NULL OR v_run_at <= pg_catalog.now() THEN
                    PERFORM pg_catalog.pg_notify('soniq_new_job', v_queue);
                END IF;
                RETURN v_found;
            END IF;

            -- An equal queued job blocked the insert: return it.
            IF v_dedup IS NOT NULL THEN
                SELECT j.id INTO v_found FROM {schema}.soniq_jobs AS j
                 WHERE j.dedup_key = v_dedup AND j.status = 'queued';
            END IF;
            IF v_found IS NULL AND v_unique THEN
                SELECT j.id INTO v_found FROM {schema}.soniq_jobs AS j
                 WHERE j.job_name = v_job_name AND j.args_hash = v_hash AND j.status = 'queued';
            END IF;
            IF v_found IS NOT NULL THEN
                RETURN v_found;
            END IF;
            -- Under REPEATABLE READ or SERIALIZABLE the blocking job was committed
            -- after this transaction's snapshot and stays invisible: only a retry
            -- of the whole transaction can return it.
            IF pg_catalog.current_setting('transaction_isolation') <> 'read committed' THEN
                RAISE EXCEPTION 'an equal job was enqueued concurrently; retry the transaction'
                    USING ERRCODE = '40001';
            END IF;
            -- READ COMMITTED: the blocking job left the queue in between; try again.
        END LOOP;
        RAISE EXCEPTION 'equal jobs kept appearing and leaving the queue; retry the transaction'
            USING ERRCODE = '40001';
    END;
END
$fn$;
