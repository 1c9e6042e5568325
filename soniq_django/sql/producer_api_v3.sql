-- soniq_django producer API, version 3 (PostgreSQL only): a dead-lettered job's id is taken.
--
-- Loaded by migration 0011_protocol_edges with {schema} replaced by the
-- quoted schema that holds the soniq tables; producer_api_v3.down.sql and
-- the released bodies of producer_api_v2.sql put version 2 back. Never
-- edited once released.
--
-- Version 2 accepted a job_id that only soniq_dead_letter_jobs held. When
-- that second job was dead-lettered too, the move overwrote the first one's
-- dead-letter row -- with an owned submission's identity in it, so a replay
-- of the original submission no longer found its job. Now an id held by
-- either table is taken: soniq_enqueue and soniq_enqueue_many raise 23505,
-- as for a live job's id (constraint soniq_dead_letter_jobs_pkey names which
-- table holds it). Everything else -- signatures, defaults, rules, SQLSTATEs,
-- HINTs, messages, the trust model and "Why short args skip the scans" --
-- is version 2's (see producer_api_v2.sql); only these two checks are new.
-- A generated id is never checked: a fresh random UUID is in neither table.

-- soniq_enqueue (version 3 body; same signature) --
-- Insert one queued job and return its id, or the id of an equal job that
-- is still queued (same dedup_key, or same job_name and args_hash for a
-- unique job). Errors: 22023 with a SONIQ_* HINT for bad input, 23505 for
-- a job_id held by a job or a dead-lettered job, 40001 under REPEATABLE READ/SERIALIZABLE when an
-- equal job was committed by a transaction this one cannot see.
-- Idle workers are woken by NOTIFY soniq_new_job at commit.
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
    v_found uuid;
    v_constraint text;
    v_pattern text;
BEGIN
    -- The pattern as soniq_task_name_pattern_v1() reads it (see "The
    -- database's own settings" in producer_api_v2.sql), queried here rather than through that
    -- function: a nested call to a function with a SET clause costs a GUC
    -- save and restore and a new search path.
    SELECT pg_catalog.substr(setting, pg_catalog.length('soniq.task_name_pattern=') + 1)
      INTO v_pattern
      FROM pg_catalog.pg_db_role_setting AS s
     CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) AS setting
     WHERE s.setrole = 0
       AND s.setdatabase = pg_catalog.substring(
               pg_catalog.pg_relation_filepath('pg_catalog.pg_proc'::pg_catalog.regclass),
               '([0-9]+)/[0-9]+$')::pg_catalog.oid
       AND pg_catalog.starts_with(setting, 'soniq.task_name_pattern=')
     LIMIT 1;
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
            pg_catalog.sha256(pg_catalog.convert_to({schema}.soniq_canonical_json_v1(v_args), 'UTF8')),
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
                ON CONFLICT (dedup_key) WHERE status = 'queued' AND dedup_key IS NOT NULL DO NOTHING
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
END
$fn$;

-- soniq_enqueue_many (version 3 body; same signature) --
-- Enqueue every element of `jobs`, a JSON array of objects whose keys are
-- soniq_enqueue's parameter names (job_name, args, queue, priority, run_at,
-- max_attempts, unique_job, dedup_key, producer_id, job_id). A missing key
-- means the parameter's default; JSON null means SQL NULL (so
-- "max_attempts": null stores NULL, as max_attempts => NULL does). Other
-- values are converted as text literals of the parameter's type ("run_at":
-- "2024-05-01T09:00:00Z"); a value that does not convert fails with that
-- conversion's SQLSTATE (22P02, 22007, 22008, 22003). args is taken as the
-- JSON value itself.
--
-- Returns the job ids in array order: for a unique or dedup job, the id
-- soniq_enqueue returns (a later element can get an earlier one's id).
-- All or nothing: every element is checked first, and the first invalid
-- one (in array order), by soniq_enqueue's rules in soniq_enqueue's order,
-- raises that rule's 22023 error with the element's position in DETAIL.
-- `jobs` that is not an array, an element that is not an object, and an
-- unknown key are 22023 / SONIQ_INVALID_OPTION. Then the plain jobs (not
-- unique, no dedup_key) are inserted by one statement (23505 for a job_id
-- that exists or repeats), and the other jobs go through soniq_enqueue in
-- array order (so 40001 as there). Workers are woken by one NOTIFY per
-- queue that got a job due now.
CREATE OR REPLACE FUNCTION {schema}.soniq_enqueue_many(jobs jsonb) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_jobs jsonb := soniq_enqueue_many.jobs;
    v_pattern text;
    v_producer text;
    v_position bigint;
    v_problem text;
    v_ids uuid[];
    v_queues text[];
    r record;
BEGIN
    IF v_jobs IS NULL OR pg_catalog.jsonb_typeof(v_jobs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'jobs must be a JSON array of objects'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
    END IF;
    -- The pattern, once for all elements (as soniq_enqueue reads it).
    SELECT pg_catalog.substr(setting, pg_catalog.length('soniq.task_name_pattern=') + 1)
      INTO v_pattern
      FROM pg_catalog.pg_db_role_setting AS s
     CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) AS setting
     WHERE s.setrole = 0
       AND s.setdatabase = pg_catalog.substring(
               pg_catalog.pg_relation_filepath('pg_catalog.pg_proc'::pg_catalog.regclass),
               '([0-9]+)/[0-9]+$')::pg_catalog.oid
       AND pg_catalog.starts_with(setting, 'soniq.task_name_pattern=')
     LIMIT 1;
    v_pattern := coalesce(v_pattern, E'^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$');

    -- One pass: the first invalid element and the first rule it breaks. The
    -- CASE stops at the first rule that fires, and the scan yields elements
    -- in array order, so LIMIT 1 ends the pass there.
    SELECT e.ord, e.problem INTO v_position, v_problem
      FROM (
        SELECT x.ord, CASE
            WHEN pg_catalog.jsonb_typeof(x.job) IS DISTINCT FROM 'object' THEN 'element'
            WHEN NOT (x.job - ARRAY['job_name', 'args', 'queue', 'priority', 'run_at',
                                    'max_attempts', 'unique_job', 'dedup_key',
                                    'producer_id', 'job_id']) = '{}'::jsonb THEN 'key'
            -- The conversions, where a call of soniq_enqueue would make them: before
            -- any rule. (A converted non-NULL value is never NULL: these branches
            -- only make a value that does not convert fail here.)
            WHEN (x.job ->> 'priority')::integer IS NULL AND (x.job ->> 'priority') IS NOT NULL
              OR (x.job ->> 'run_at')::timestamptz IS NULL AND (x.job ->> 'run_at') IS NOT NULL
              OR (x.job ->> 'max_attempts')::integer IS NULL
                 AND (x.job ->> 'max_attempts') IS NOT NULL
              OR (x.job ->> 'unique_job')::boolean IS NULL
                 AND (x.job ->> 'unique_job') IS NOT NULL
              OR (x.job ->> 'job_id')::uuid IS NULL AND (x.job ->> 'job_id') IS NOT NULL
                THEN 'unreachable'
            WHEN (x.job ->> 'job_name') IS NULL OR (x.job ->> 'job_name') !~ v_pattern
                THEN 'job_name'
            WHEN pg_catalog.jsonb_typeof(coalesce(x.job -> 'args', '{}'::jsonb))
                 IS DISTINCT FROM 'object' THEN 'args'
            WHEN pg_catalog.octet_length((x.job -> 'args')::text) >= 315
                 AND pg_catalog.jsonb_path_exists(x.job -> 'args',
                     'strict $.**{499} ? (@.type() == "object" || @.type() == "array")')
                THEN 'args_depth'
            WHEN pg_catalog.octet_length((x.job -> 'args')::text) >= 315
                 AND pg_catalog.jsonb_path_exists(x.job -> 'args',
                     'strict $.** ? (@.type() == "number" && @.abs() >= $overflow)',
                     '{"overflow": 179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792}')
                THEN 'args_number'
            WHEN (x.job ->> 'max_attempts')::integer < 1 THEN 'max_attempts'
            WHEN (x.job ->> 'queue') = '' OR pg_catalog.length(x.job ->> 'queue') > 255
                THEN 'queue'
            WHEN (x.job ->> 'dedup_key') = '' OR pg_catalog.length(x.job ->> 'dedup_key') > 255
                THEN 'dedup_key'
            WHEN (x.job ->> 'producer_id') = ''
                 OR pg_catalog.length(x.job ->> 'producer_id') > 255 THEN 'producer_id'
        END AS problem
          FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS x(job, ord)
      ) AS e
     WHERE e.problem IS NOT NULL
     ORDER BY e.ord
     LIMIT 1;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = CASE v_problem
                WHEN 'element' THEN 'each job must be a JSON object'
                WHEN 'key' THEN 'a job has a key that is not a soniq_enqueue parameter'
                WHEN 'job_name' THEN 'job name does not match the task-name pattern'
                WHEN 'args' THEN 'job args must be a JSON object'
                WHEN 'args_depth' THEN 'job args nest 500 or more levels deep'
                WHEN 'args_number' THEN 'job args hold a number too large for a 64-bit float'
                WHEN 'max_attempts' THEN 'max_attempts must be at least 1'
                ELSE v_problem || ' must be 1 to 255 characters' END,
            HINT = CASE
                WHEN v_problem = 'job_name' THEN 'SONIQ_INVALID_TASK_NAME'
                WHEN v_problem IN ('args', 'args_depth', 'args_number')
                    THEN 'SONIQ_TASK_ARGS_INVALID'
                WHEN v_problem = 'max_attempts' THEN 'SONIQ_INVALID_MAX_ATTEMPTS'
                ELSE 'SONIQ_INVALID_OPTION' END,
            DETAIL = pg_catalog.format('jobs element %s (counting from 1)', v_position);
    END IF;

    -- A requested job_id held by a dead-lettered job is taken, as one held by
    -- a live job is (that one fails the INSERT below on soniq_jobs_pkey).
    IF EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(v_jobs) AS x(job)
                WHERE x.job ? 'job_id'
                  AND EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS d
                               WHERE d.id = (x.job ->> 'job_id')::uuid)) THEN
        RAISE EXCEPTION 'duplicate key value: a job id is held by a dead-lettered job'
            USING ERRCODE = '23505', CONSTRAINT = 'soniq_dead_letter_jobs_pkey';
    END IF;
    v_producer := coalesce(
        NULLIF(pg_catalog.current_setting('application_name'), ''), session_user);
    -- Every element's id (the requested job_id or a new one), and the plain
    -- jobs inserted by one statement; the CTE is read twice, so it is
    -- evaluated once and both reads see the same new ids.
    WITH src AS MATERIALIZED (
        SELECT x.ord,
               coalesce((x.job ->> 'job_id')::uuid, pg_catalog.gen_random_uuid()) AS id,
               x.job
          FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS x(job, ord)
    ),
    plain AS (
        INSERT INTO {schema}.soniq_jobs AS j
            (id, job_name, args, args_hash, status, attempts, max_attempts, queue,
             priority, unique_job, dedup_key, scheduled_at, producer_id)
        SELECT src.id,
               src.job ->> 'job_name',
               coalesce(src.job -> 'args', '{}'::jsonb),
               NULL, 'queued', 0,
               CASE WHEN src.job ? 'max_attempts' THEN (src.job ->> 'max_attempts')::integer
                    ELSE 4 END,
               coalesce(src.job ->> 'queue', 'default'),
               coalesce((src.job ->> 'priority')::integer, 100),
               false, NULL,
               (src.job ->> 'run_at')::timestamptz,
               coalesce(src.job ->> 'producer_id', v_producer)
          FROM src
         WHERE NOT coalesce((src.job ->> 'unique_job')::boolean, false)
           AND (src.job ->> 'dedup_key') IS NULL
         ORDER BY src.ord
        RETURNING j.queue, j.scheduled_at
    )
    SELECT (SELECT pg_catalog.array_agg(src.id ORDER BY src.ord) FROM src),
           (SELECT pg_catalog.array_agg(DISTINCT plain.queue) FROM plain
             WHERE plain.scheduled_at IS NULL OR plain.scheduled_at <= pg_catalog.now())
      INTO v_ids, v_queues;

    -- Unique and dedup jobs: the per-row path, in array order.
    FOR r IN
        SELECT x.ord, x.job
          FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS x(job, ord)
         WHERE coalesce((x.job ->> 'unique_job')::boolean, false)
            OR (x.job ->> 'dedup_key') IS NOT NULL
         ORDER BY x.ord
    LOOP
        v_ids[r.ord] := {schema}.soniq_enqueue(
            r.job ->> 'job_name',
            coalesce(r.job -> 'args', '{}'::jsonb),
            queue => r.job ->> 'queue',
            priority => (r.job ->> 'priority')::integer,
            run_at => (r.job ->> 'run_at')::timestamptz,
            max_attempts => CASE WHEN r.job ? 'max_attempts'
                                 THEN (r.job ->> 'max_attempts')::integer ELSE 4 END,
            unique_job => (r.job ->> 'unique_job')::boolean,
            dedup_key => r.job ->> 'dedup_key',
            producer_id => coalesce(r.job ->> 'producer_id', v_producer),
            job_id => v_ids[r.ord]);
    END LOOP;

    IF v_queues IS NOT NULL THEN
        PERFORM pg_catalog.pg_notify('soniq_new_job', q.queue)
           FROM pg_catalog.unnest(v_queues) AS q(queue);
    END IF;
    RETURN coalesce(v_ids, '{}'::uuid[]);
END
$fn$;

