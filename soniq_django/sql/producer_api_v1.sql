-- soniq_django producer API, version 1 (PostgreSQL only).
--
-- Loaded by migration 0002_producer_api with {schema} replaced by the quoted
-- schema that holds the soniq tables. Released functions are never edited:
-- a change ships as a new file and a new migration.
--
-- Trust model. The public functions (soniq_enqueue, soniq_get_job,
-- soniq_args_hash) are SECURITY DEFINER, so a producer needs EXECUTE on them
-- and nothing on the tables. Every function pins search_path to pg_catalog
-- and pg_temp: the schema holding the tables (often "public", writable by
-- every role before PostgreSQL 15) is not on it, so a function or operator
-- planted there can never be picked, and tables are named with their schema.
-- Built-ins are also called by their pg_catalog names. Nothing is executable
-- by PUBLIC; `manage.py soniq_grant ROLE` grants the three public functions.

-- soniq_task_name_pattern_v1 --
-- The task-name pattern set for this database with
-- `ALTER DATABASE ... SET soniq.task_name_pattern = '...'`, or the default.
-- Read from the catalog, not current_setting(): a caller's SET or a per-role
-- setting must not loosen the check for that caller.
CREATE FUNCTION {schema}.soniq_task_name_pattern_v1() RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
-- PL/pgSQL, not SQL: the catalog query's plan is then cached per session
-- instead of being planned again in every enqueue.
DECLARE
    v_pattern text;
BEGIN
    SELECT pg_catalog.substr(setting, pg_catalog.length('soniq.task_name_pattern=') + 1)
      INTO v_pattern
      FROM pg_catalog.pg_db_role_setting AS s
     CROSS JOIN LATERAL pg_catalog.unnest(s.setconfig) AS setting
     WHERE s.setrole = 0
       AND s.setdatabase = (SELECT d.oid FROM pg_catalog.pg_database AS d
                             WHERE d.datname = pg_catalog.current_database())
       AND pg_catalog.starts_with(setting, 'soniq.task_name_pattern=')
     LIMIT 1;
    RETURN coalesce(v_pattern, E'^[a-z][a-z0-9_]*(\\.[a-z][a-z0-9_]*)*$');
END
$fn$;

-- soniq_check_args_v1 --
-- Raise 22023 / SONIQ_TASK_ARGS_INVALID unless args is a JSON object that
-- nests fewer than 500 levels (the object itself is level 1) and holds no
-- number a 64-bit float cannot represent (Python would read it as inf).
-- The bound is 2^1024 - 2^970: from there on, round-to-nearest overflows.
CREATE FUNCTION {schema}.soniq_check_args_v1(args jsonb) RETURNS void
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF args IS NULL OR pg_catalog.jsonb_typeof(args) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'job args must be a JSON object'
            USING ERRCODE = '22023', HINT = 'SONIQ_TASK_ARGS_INVALID';
    END IF;
    -- jsonpath level 0 is the args object, so level 499 is the 500th level.
    IF pg_catalog.jsonb_path_exists(
        args, 'strict $.**{499} ? (@.type() == "object" || @.type() == "array")'
    ) THEN
        RAISE EXCEPTION 'job args nest 500 or more levels deep'
            USING ERRCODE = '22023', HINT = 'SONIQ_TASK_ARGS_INVALID';
    END IF;
    IF pg_catalog.jsonb_path_exists(
        args,
        'strict $.** ? (@.type() == "number" && @.abs() >= $overflow)',
        '{"overflow": 179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704342711559699508093042880177904174497792}'
    ) THEN
        RAISE EXCEPTION 'job args hold a number too large for a 64-bit float'
            USING ERRCODE = '22023', HINT = 'SONIQ_TASK_ARGS_INVALID';
    END IF;
END
$fn$;

-- soniq_json_string_v1 --
-- A string as Python's json.dumps writes it by default: ASCII only, short
-- escapes for " \ \n \r \t \b \f, \u00xx for other controls and DEL,
-- lowercase \uxxxx for the rest, UTF-16 surrogate pairs above U+FFFF.
-- Printable ASCII without " or \ (the common case) is copied as is.
CREATE FUNCTION {schema}.soniq_json_string_v1(value text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT CASE
        WHEN value ~ E'^[\\x20\\x21\\x23-\\x5b\\x5d-\\x7e]*$' THEN '"' || value || '"'
        ELSE '"' || (
            SELECT pg_catalog.string_agg(
                CASE
                    WHEN c.ch = '"' THEN E'\\"'
                    WHEN c.ch = E'\\' THEN E'\\\\'
                    WHEN c.ch = E'\n' THEN E'\\n'
                    WHEN c.ch = E'\r' THEN E'\\r'
                    WHEN c.ch = E'\t' THEN E'\\t'
                    WHEN c.ch = E'\b' THEN E'\\b'
                    WHEN c.ch = E'\f' THEN E'\\f'
                    WHEN pg_catalog.ascii(c.ch) BETWEEN 32 AND 126 THEN c.ch
                    WHEN pg_catalog.ascii(c.ch) <= 65535 THEN
                        E'\\u' || pg_catalog.lpad(pg_catalog.to_hex(pg_catalog.ascii(c.ch)), 4, '0')
                    ELSE
                        E'\\u' || pg_catalog.to_hex(55296 + ((pg_catalog.ascii(c.ch) - 65536) >> 10))
                        || E'\\u' || pg_catalog.to_hex(56320 + ((pg_catalog.ascii(c.ch) - 65536) & 1023))
                END,
                '' ORDER BY c.n)
            FROM pg_catalog.regexp_split_to_table(value, '') WITH ORDINALITY AS c(ch, n)
        ) || '"'
    END
$fn$;

-- soniq_canonical_json_v1 --
-- The canonical text args_hash is taken over: keys sorted by code point at
-- every level, "," and ":" separators, strings as soniq_json_string_v1,
-- numbers as jsonb prints them. A recursive CTE walks the document without
-- recursion on the C stack (args may nest 499 levels). Each node gets a path
-- of text segments whose byte order (COLLATE "C") is document order: a child
-- segment starts with '1', a container's closing bracket sits at path || '2',
-- after every child.
CREATE FUNCTION {schema}.soniq_canonical_json_v1(args jsonb) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
    WITH RECURSIVE node(path, value, prefix) AS (
        SELECT ARRAY[]::text[], args, ''::text
        UNION ALL
        SELECT node.path || child.segment, child.value, child.prefix
          FROM node
         CROSS JOIN LATERAL (
            SELECT '1' || e.key AS segment,
                   e.value,
                   CASE WHEN pg_catalog.row_number() OVER (ORDER BY e.key COLLATE "C") = 1
                        THEN '' ELSE ',' END
                   || {schema}.soniq_json_string_v1(e.key) || ':' AS prefix
              FROM pg_catalog.jsonb_each(
                       CASE WHEN pg_catalog.jsonb_typeof(node.value) = 'object' THEN node.value END
                   ) AS e
            UNION ALL
            SELECT '1' || pg_catalog.lpad(a.n::text, 12, '0'),
                   a.value,
                   CASE WHEN a.n = 1 THEN '' ELSE ',' END
              FROM pg_catalog.jsonb_array_elements(
                       CASE WHEN pg_catalog.jsonb_typeof(node.value) = 'array' THEN node.value END
                   ) WITH ORDINALITY AS a(value, n)
         ) AS child
    ),
    token(path, piece) AS (
        SELECT node.path,
               node.prefix || CASE pg_catalog.jsonb_typeof(node.value)
                   WHEN 'object' THEN '{'
                   WHEN 'array' THEN '['
                   WHEN 'string' THEN {schema}.soniq_json_string_v1(node.value #>> '{}')
                   ELSE node.value::text
               END
          FROM node
        UNION ALL
        SELECT node.path || '2'::text,
               CASE pg_catalog.jsonb_typeof(node.value) WHEN 'object' THEN '}' ELSE ']' END
          FROM node
         WHERE pg_catalog.jsonb_typeof(node.value) IN ('object', 'array')
    )
    SELECT pg_catalog.string_agg(token.piece, '' ORDER BY token.path COLLATE "C") FROM token
$fn$;

-- soniq_args_hash --
-- format 1's args_hash: lowercase hex SHA-256 of the canonical text.
-- Refuses what enqueue refuses (22023 / SONIQ_TASK_ARGS_INVALID).
CREATE FUNCTION {schema}.soniq_args_hash(args jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    PERFORM {schema}.soniq_check_args_v1(args);
    RETURN pg_catalog.encode(
        pg_catalog.sha256(pg_catalog.convert_to({schema}.soniq_canonical_json_v1(args), 'UTF8')),
        'hex');
END
$fn$;

-- soniq_enqueue --
-- Insert one queued job and return its id, or the id of an equal job that
-- is still queued (same dedup_key, or same job_name and args_hash for a
-- unique job). Errors: 22023 with a SONIQ_* HINT for bad input, 23505 for
-- an existing job_id, 40001 under REPEATABLE READ/SERIALIZABLE when an
-- equal job was committed by a transaction this one cannot see.
-- Idle workers are woken by NOTIFY soniq_new_job at commit.
CREATE FUNCTION {schema}.soniq_enqueue(
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
BEGIN
    IF v_job_name IS NULL OR v_job_name !~ {schema}.soniq_task_name_pattern_v1() THEN
        RAISE EXCEPTION 'job name does not match the task-name pattern'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_TASK_NAME';
    END IF;
    PERFORM {schema}.soniq_check_args_v1(v_args);
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

-- soniq_get_job --
-- One job by id, as producers see it: a dead-lettered job has status
-- 'dead_letter'; an unknown id, or a finished job past expires_at (also one
-- replayed from the dead letters), gives no row.
CREATE FUNCTION {schema}.soniq_get_job(job_id uuid)
RETURNS TABLE (
    id uuid, job_name text, status text, queue text, attempts integer,
    max_attempts integer, result jsonb, last_error text, dead_letter_reason text,
    scheduled_at timestamptz, created_at timestamptz, updated_at timestamptz
)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT found.id, found.job_name, found.status, found.queue, found.attempts,
           found.max_attempts, found.result, found.last_error, found.dead_letter_reason,
           found.scheduled_at, found.created_at, found.updated_at
      FROM (
        SELECT 1 AS source, j.id, j.job_name, j.status, j.queue, j.attempts, j.max_attempts,
               j.result, j.last_error, NULL::text AS dead_letter_reason, j.scheduled_at,
               j.created_at, j.updated_at
          FROM {schema}.soniq_jobs AS j
         WHERE j.id = $1 AND (j.expires_at IS NULL OR j.expires_at > pg_catalog.now())
        UNION ALL
        SELECT 2, d.id, d.job_name, 'dead_letter', d.queue, d.attempts, d.max_attempts,
               NULL::jsonb, d.last_error, d.dead_letter_reason, NULL::timestamptz,
               d.original_created_at, d.moved_to_dead_letter_at
          FROM {schema}.soniq_dead_letter_jobs AS d
         WHERE d.id = $1
           -- A dead letter replayed since it last failed no longer describes the job.
           AND (d.last_resurrection_at IS NULL
                OR d.last_resurrection_at < d.moved_to_dead_letter_at)
      ) AS found
     ORDER BY found.source
     LIMIT 1
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_task_name_pattern_v1() FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_check_args_v1(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_json_string_v1(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_canonical_json_v1(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_args_hash(jsonb) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_enqueue(text, jsonb, text, integer, timestamptz, integer, boolean, text, text, uuid) FROM PUBLIC;
REVOKE ALL ON FUNCTION {schema}.soniq_get_job(uuid) FROM PUBLIC;
