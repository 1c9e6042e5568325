-- soniq_django producer API, version 6 (PostgreSQL only): many jobs that wait
-- for other jobs, in one call.
--
-- Loaded by migration 0027_enqueue_after_many, with {schema} replaced by the
-- quoted schema that holds the soniq tables; producer_api_v6.down.sql drops
-- what it adds. Never edited once released. Nothing of version 5 changes:
-- soniq_enqueue_after stays the one-job call.
--
-- soniq_enqueue_after_many(jobs jsonb, result_ttl_seconds float8 DEFAULT 300)
--     -> uuid[]
--
-- jobs is soniq_enqueue_many's JSON array (docs/sql-api.md), each element
-- with two more keys: "depends_on" (required: a JSON array of at most 1000
-- job ids, as text) and "any_outcome" (optional boolean: wait for each
-- dependency to finish whatever its outcome -- a batch's callback). The
-- result is what that many calls of soniq_enqueue_after, in array order, in
-- one transaction, would give -- ids in array order, the same rows, edges,
-- waits, marks and at-once cancellations -- made by a few set-based
-- statements instead of one call per job (decision 0045):
--
-- 1. Every element's id: its job_id, or a new one.
-- 2. Its edges, each dependency once (the first mention keeps its place). A
--    dependency that names an EARLIER element's id is that element (it is
--    enqueued by this call, before this one); any other is looked up in the
--    job tables, as soniq_enqueue_after does -- so an element cannot name
--    itself or a later one, and no cycle can be built.
-- 3. The jobs outside the call are locked in id order (two calls cannot
--    deadlock) and marked has_dependents while they can still end, through
--    the protection trigger's gate; their states are read after the locks.
--    A name found nowhere refuses the whole call: SQLSTATE 22023, HINT
--    SONIQ_UNKNOWN_DEPENDENCY, DETAIL naming the element, nothing written.
-- 4. An element that needs its dependencies done (not any_outcome) and has
--    one that is cancelled or dead-lettered is cancelled at once (as
--    version 5's step 5); so is one that names such an element of this call
--    -- found by one recursive query, since edges inside the call point
--    back only. Its last_error names the first failed dependency in its
--    depends_on order.
-- 5. The jobs go in through one soniq_enqueue_many call (its checks, codes
--    and duplicate rules), at 9999-01-01 UTC when something is left to wait
--    for or they are cancelled at once. An element whose unique or dedup job
--    found an equal queued job gets that job's id back and nothing else of
--    it is written; a later element that names it is refused (step 3's
--    error), as it would be one call at a time.
-- 6. The marks of the elements other elements name, the edges (one INSERT),
--    the cancellations (one UPDATE), the waits rows (one INSERT).
--
-- Errors come in this order: the call's own input (jobs not an array, a
-- depends_on or any_outcome that is not what it must be: 22023
-- SONIQ_INVALID_OPTION with the element in DETAIL; a depends_on entry that
-- is not a UUID: 22P02), then an unknown dependency, then
-- soniq_enqueue_many's errors for the jobs themselves.

CREATE FUNCTION {schema}.soniq_enqueue_after_many(
    jobs jsonb,
    result_ttl_seconds double precision DEFAULT 300
) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    v_jobs jsonb := soniq_enqueue_after_many.jobs;
    p_ttl double precision := soniq_enqueue_after_many.result_ttl_seconds;
    v_bad bigint;
    v_ids uuid[];          -- element i's id
    v_any boolean[];       -- element i waits for any outcome
    v_run_at timestamptz[];
    e_job integer[];       -- edge k: element e_job[k] depends on e_dep[k] ...
    e_dep uuid[];
    e_pos integer[];       -- ... its place in that element's depends_on
    e_src integer[];       -- the earlier element it names, or NULL: a job outside the call
    e_state text[];
    v_outside uuid[];
    v_failed integer[];    -- the elements cancelled at once
    v_is_failed boolean[]; -- element i is one of them
    v_named integer[];     -- the elements other elements name
    v_held boolean[];
    v_found uuid[];
    v_gate text;
    v_now timestamptz;
BEGIN
    IF v_jobs IS NULL OR pg_catalog.jsonb_typeof(v_jobs) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'jobs must be a JSON array of objects'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
    END IF;
    IF p_ttl IS NULL OR p_ttl = 'NaN'::float8 OR p_ttl < 0 OR p_ttl > 31536000 THEN
        RAISE EXCEPTION 'result_ttl_seconds is out of range'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION';
    END IF;
    -- The call's own keys. (Elements that are not objects are soniq_enqueue_many's
    -- to refuse, below; their depends_on reads as NULL here.)
    SELECT x.ord INTO v_bad
      FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS x(job, ord)
     WHERE pg_catalog.jsonb_typeof(x.job) = 'object' AND CASE
           WHEN pg_catalog.jsonb_typeof(x.job -> 'depends_on') IS DISTINCT FROM 'array' THEN true
           WHEN pg_catalog.jsonb_array_length(x.job -> 'depends_on') > 1000 THEN true
           WHEN pg_catalog.jsonb_typeof(x.job -> 'any_outcome') NOT IN ('boolean', 'null')
               THEN true
           ELSE EXISTS (SELECT 1 FROM pg_catalog.jsonb_array_elements(x.job -> 'depends_on')
                         AS d(v) WHERE pg_catalog.jsonb_typeof(d.v) <> 'string') END
     ORDER BY x.ord LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'depends_on must be an array of at most 1000 job ids (text), and '
                        'any_outcome a boolean'
            USING ERRCODE = '22023', HINT = 'SONIQ_INVALID_OPTION',
                  DETAIL = pg_catalog.format('jobs element %s (counting from 1)', v_bad);
    END IF;

    -- 1. Every element's id and options.
    SELECT pg_catalog.array_agg(coalesce((x.job ->> 'job_id')::uuid,
                                         pg_catalog.gen_random_uuid()) ORDER BY x.ord),
           pg_catalog.array_agg(coalesce((x.job ->> 'any_outcome')::boolean, false)
                                ORDER BY x.ord),
           pg_catalog.array_agg((x.job ->> 'run_at')::timestamptz ORDER BY x.ord)
      INTO v_ids, v_any, v_run_at
      FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS x(job, ord);
    IF v_ids IS NULL THEN
        RETURN ARRAY[]::uuid[];
    END IF;

    -- 2. The edges; an id of an earlier element is that element.
    SELECT pg_catalog.array_agg(e.job ORDER BY e.job, e.pos),
           pg_catalog.array_agg(e.dep ORDER BY e.job, e.pos),
           pg_catalog.array_agg(e.pos ORDER BY e.job, e.pos),
           pg_catalog.array_agg(e.src ORDER BY e.job, e.pos)
      INTO e_job, e_dep, e_pos, e_src
      FROM (SELECT d.job, d.dep, pg_catalog.min(d.pos)::integer AS pos,
                   pg_catalog.min(i.first)::integer AS src
              FROM (SELECT x.ord::integer AS job, t.v::uuid AS dep, t.pos
                      FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS x(job, ord)
                     CROSS JOIN LATERAL pg_catalog.jsonb_array_elements_text(
                           CASE WHEN pg_catalog.jsonb_typeof(x.job) = 'object'
                                THEN x.job -> 'depends_on' END) WITH ORDINALITY AS t(v, pos)
                   ) AS d
              -- A hash join, not a scan of the ids per edge: each id's first element.
              LEFT JOIN (SELECT u.id, pg_catalog.min(u.ord) AS first
                           FROM pg_catalog.unnest(v_ids) WITH ORDINALITY AS u(id, ord)
                          GROUP BY u.id) AS i ON i.id = d.dep AND i.first < d.job
             GROUP BY d.job, d.dep) AS e;
    e_job := coalesce(e_job, ARRAY[]::integer[]);
    e_dep := coalesce(e_dep, ARRAY[]::uuid[]);
    e_pos := coalesce(e_pos, ARRAY[]::integer[]);
    e_src := coalesce(e_src, ARRAY[]::integer[]);

    -- 3. The jobs outside the call: locked in id order, marked, then read.
    v_outside := ARRAY(SELECT DISTINCT d.id
                         FROM ROWS FROM (pg_catalog.unnest(e_dep), pg_catalog.unnest(e_src))
                              AS d(id, src)
                        WHERE d.src IS NULL);
    v_gate := pg_catalog.current_setting('soniq.fenced_write', true);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    PERFORM 1 FROM {schema}.soniq_jobs AS j
     WHERE j.id = ANY (v_outside) ORDER BY j.id FOR UPDATE;
    UPDATE {schema}.soniq_jobs AS j SET has_dependents = true
     WHERE j.id = ANY (v_outside) AND j.status IN ('queued', 'processing')
       AND j.has_dependents IS NOT TRUE;
    PERFORM pg_catalog.set_config('soniq.fenced_write', coalesce(v_gate, 'off'), true);
    e_state := ARRAY(
        SELECT CASE WHEN d.src IS NOT NULL THEN 'inside'
                    WHEN j.status = 'done' THEN 'done'
                    WHEN j.status = 'cancelled' THEN 'failed'
                    WHEN j.status IN ('queued', 'processing') THEN 'waiting'
                    WHEN j.id IS NULL
                         AND EXISTS (SELECT 1 FROM {schema}.soniq_dead_letter_jobs AS x
                                      WHERE x.id = d.id) THEN 'failed'
               END
          FROM ROWS FROM (pg_catalog.unnest(e_dep), pg_catalog.unnest(e_src))
               WITH ORDINALITY AS d(id, src, k)
          LEFT JOIN {schema}.soniq_jobs AS j ON j.id = d.id AND d.src IS NULL
         ORDER BY d.k);
    IF pg_catalog.array_position(e_state, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'a job named in depends_on does not exist'
            USING ERRCODE = '22023', HINT = 'SONIQ_UNKNOWN_DEPENDENCY',
                  DETAIL = pg_catalog.format('jobs element %s (counting from 1)',
                                             e_job[pg_catalog.array_position(e_state, NULL)]);
    END IF;

    -- 4. The elements cancelled at once: a failed job outside, or a cancelled element
    --    named (edges inside point back, so the recursion ends).
    WITH RECURSIVE edge AS (
        SELECT * FROM ROWS FROM (pg_catalog.unnest(e_job), pg_catalog.unnest(e_src),
                                 pg_catalog.unnest(e_state)) AS e(job, src, state)
    ), failed(job) AS (
        SELECT e.job FROM edge AS e WHERE e.state = 'failed' AND NOT v_any[e.job]
        UNION
        SELECT e.job FROM edge AS e JOIN failed AS f ON e.src = f.job WHERE NOT v_any[e.job]
    )
    SELECT coalesce(pg_catalog.array_agg(f.job), ARRAY[]::integer[]) INTO v_failed FROM failed AS f;
    -- By element (index lookups from here on, never a scan of a list per row).
    v_is_failed := ARRAY(
        SELECT f.job IS NOT NULL
          FROM pg_catalog.generate_subscripts(v_ids, 1) AS i(ord)
          LEFT JOIN pg_catalog.unnest(v_failed) AS f(job) ON f.job = i.ord ORDER BY i.ord);
    e_state := ARRAY(
        SELECT CASE WHEN e.state <> 'inside' THEN e.state
                    WHEN v_is_failed[e.src] THEN 'failed' ELSE 'waiting' END
          FROM ROWS FROM (pg_catalog.unnest(e_state), pg_catalog.unnest(e_src))
               WITH ORDINALITY AS e(state, src, k)
         ORDER BY e.k);
    v_held := ARRAY(
        SELECT v_is_failed[i.ord] OR w.job IS NOT NULL
          FROM pg_catalog.generate_subscripts(v_ids, 1) AS i(ord)
          LEFT JOIN (SELECT DISTINCT e.job
                       FROM ROWS FROM (pg_catalog.unnest(e_job), pg_catalog.unnest(e_state))
                            AS e(job, state)
                      WHERE e.state = 'waiting') AS w ON w.job = i.ord
         ORDER BY i.ord);

    -- 5. The jobs, through soniq_enqueue_many: held ones at 9999-01-01.
    v_found := {schema}.soniq_enqueue_many((
        SELECT pg_catalog.jsonb_agg(CASE WHEN pg_catalog.jsonb_typeof(x.job) = 'object' THEN
                   (x.job - 'depends_on' - 'any_outcome')
                   || pg_catalog.jsonb_build_object('job_id', v_ids[x.ord])
                   || CASE WHEN v_held[x.ord]
                           THEN '{"run_at": "9999-01-01T00:00:00+00:00"}'::jsonb
                           ELSE '{}'::jsonb END
                   ELSE x.job END ORDER BY x.ord)
          FROM pg_catalog.jsonb_array_elements(v_jobs) WITH ORDINALITY AS x(job, ord)));
    -- An element named by another whose job was not written (an equal one was found).
    SELECT e.job INTO v_bad
      FROM ROWS FROM (pg_catalog.unnest(e_job), pg_catalog.unnest(e_src)) AS e(job, src)
     WHERE e.src IS NOT NULL AND v_found[e.src] IS DISTINCT FROM v_ids[e.src]
     ORDER BY e.job LIMIT 1;
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION 'a job named in depends_on does not exist'
            USING ERRCODE = '22023', HINT = 'SONIQ_UNKNOWN_DEPENDENCY',
                  DETAIL = pg_catalog.format('jobs element %s (counting from 1): the job it '
                                             'names was not enqueued (an equal job was found)',
                                             v_bad);
    END IF;

    -- 6. Marks, edges, cancellations, waits: of the elements whose job was written.
    v_named := ARRAY(SELECT DISTINCT e.src FROM pg_catalog.unnest(e_src) AS e(src)
                      WHERE e.src IS NOT NULL AND NOT v_is_failed[e.src]);
    IF pg_catalog.cardinality(v_named) > 0 THEN
        PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
        UPDATE {schema}.soniq_jobs AS j SET has_dependents = true
         WHERE j.id IN (SELECT v_ids[n] FROM pg_catalog.unnest(v_named) AS n);
        PERFORM pg_catalog.set_config('soniq.fenced_write', coalesce(v_gate, 'off'), true);
    END IF;
    INSERT INTO {schema}.soniq_job_dependencies (job_id, depends_on, any_outcome, state)
    SELECT v_ids[e.job], e.dep, v_any[e.job], e.state
      FROM ROWS FROM (pg_catalog.unnest(e_job), pg_catalog.unnest(e_dep),
                      pg_catalog.unnest(e_state)) AS e(job, dep, state)
     WHERE v_found[e.job] = v_ids[e.job];
    v_now := pg_catalog.clock_timestamp();
    UPDATE {schema}.soniq_jobs AS j
       SET status = 'cancelled', last_error = 'dependency_failed:' || f.dep::text,
           scheduled_at = v_run_at[f.job],
           expires_at = v_now + pg_catalog.make_interval(secs => p_ttl), updated_at = v_now
      FROM (SELECT DISTINCT ON (e.job) e.job, e.dep
              FROM ROWS FROM (pg_catalog.unnest(e_job), pg_catalog.unnest(e_dep),
                              pg_catalog.unnest(e_pos), pg_catalog.unnest(e_state))
                   AS e(job, dep, pos, state)
             WHERE v_is_failed[e.job] AND e.state = 'failed'
             ORDER BY e.job, e.pos) AS f
     WHERE j.id = v_ids[f.job] AND v_found[f.job] = v_ids[f.job];
    INSERT INTO {schema}.soniq_job_waits (job_id, pending, run_at, created_at)
    SELECT v_ids[e.job], pg_catalog.count(*)::integer, v_run_at[e.job], v_now
      FROM ROWS FROM (pg_catalog.unnest(e_job), pg_catalog.unnest(e_state)) AS e(job, state)
     WHERE e.state = 'waiting' AND NOT v_is_failed[e.job]
       AND v_found[e.job] = v_ids[e.job]
     GROUP BY e.job;
    RETURN v_found;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_enqueue_after_many(jsonb, double precision) FROM PUBLIC;
