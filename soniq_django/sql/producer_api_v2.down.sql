-- Reverse of producer_api_v2.sql: drop soniq_enqueue_many and put version 1's
-- soniq_enqueue back, exactly as producer_api_v1.sql defines it (same
-- signature, so grants on it are kept).
DROP FUNCTION {schema}.soniq_enqueue_many(jsonb);

-- soniq_enqueue --
-- Insert one queued job and return its id, or the id of an equal job that
-- is still queued (same dedup_key, or same job_name and args_hash for a
-- unique job). Errors: 22023 with a SONIQ_* HINT for bad input, 23505 for
-- an existing job_id, 40001 under REPEATABLE READ/SERIALIZABLE when an
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
