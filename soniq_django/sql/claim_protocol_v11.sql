-- soniq_django claim protocol, version 11 (PostgreSQL only): a completion
-- finds its row by primary key, and a claim scans in claim order, also under
-- a pinned horizon.
--
-- Versions 1 to 10 stay as they are; this file gives soniq_complete_many a
-- new body (same name, signature, answers, errors and grants), and
-- soniq_complete, a batch of one of it, follows. Loaded by migration
-- 0023_claim_protocol_v11; never edited once released. The reverse
-- (claim_protocol_v11.down.sql, then version 8's soniq_complete_many read
-- back from claim_protocol_v8.sql) restores version 10.
--
-- One change, in the path of a batch of one (a worker's completions, one
-- job at a time): the UPDATE's fence -- the claim token and generation,
-- status 'processing', a lease after the time read under the lock, no
-- cancel requested -- is written as one IS TRUE, as the batch path writes it
-- (version 7), so that the planner has only the primary key (j.id = r.id) to
-- find the row by. Versions 2 to 10 let it choose: it took the partial
-- index of processing jobs, soniq_jobs_lease_idx (lease_expires_at >
-- v_now), which its statistics say holds a handful of rows. Without a
-- pinned horizon that index is small and the plan cheap; while a snapshot
-- holds the horizon it keeps the processing version of every job finished
-- since (nothing may mark them dead), and each completion walked the leases
-- of the last 30 seconds' jobs: measured 18 buffers a completion before a
-- pin, 900 in its first minute, 1,100 after four (bench/soak.py --diagnose,
-- 300 jobs/s; docs/performance.md#a-pinned-horizon). The fence, the row
-- lock and the answers are version 10's; the predicate is the same
-- predicate, evaluated on the row found.
--
-- And soniq_claim_many runs with enable_sort = off and jit = off (settings of the
-- function, as its search_path; its body is version 10's). Its scans in
-- claim order -- from the start, or from where the last claim began --
-- read soniq_jobs_claim_now_idx in (priority, created_at) order and stop
-- after the jobs they take. Under a pinned horizon the planner came to
-- prefer reading all of soniq_jobs_unique_queued (any partial index of
-- queued jobs yields them; its statistics say it holds a handful of rows)
-- and sorting what it found: that index keeps the queued version of every
-- job since the pin, and each claim read all of them (8,950 buffers for
-- each of the two scans of a hinted claim, 40-180 ms, five to six minutes
-- into every pin at 300 jobs/s: the drain fell behind;
-- bench/soak.py --diagnose, auto_explain). Without a sort to hide behind,
-- the only plan that returns them in claim order is the ordered index
-- scan; sorts with no other plan (the merge of the scans) stay as they are.
-- jit = off with it: a sort that stays counts 10^10 in the plan's cost,
-- which would otherwise have every claim's statements JIT-compiled (85 ms a
-- claim, measured); a claim's statements are far too short for JIT to pay.

-- soniq_complete_many (version 11 body; same signature) --
CREATE OR REPLACE FUNCTION {schema}.soniq_complete_many(
    job_ids text[], worker_id text, generations bigint[], claim_tokens text[], queues text[],
    results jsonb[], result_ttl_seconds double precision DEFAULT 300
) RETURNS boolean[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
#variable_conflict use_column
DECLARE
    p_ids text[] := soniq_complete_many.job_ids;
    p_owner text := soniq_complete_many.worker_id;
    p_generations bigint[] := soniq_complete_many.generations;
    p_tokens text[] := soniq_complete_many.claim_tokens;
    p_queues text[] := soniq_complete_many.queues;
    p_results jsonb[] := soniq_complete_many.results;
    p_ttl double precision := soniq_complete_many.result_ttl_seconds;
    v_count integer := pg_catalog.cardinality(p_ids);
    v_done boolean[];
    v_now timestamptz;
    v_i integer;
    v_ids uuid[];
    v_hits bigint[];
    l_tids tid[];
    l_ids uuid[];
    l_queues text[];
    l_owners text[];
    l_generations bigint[];
    l_tokens text[];
    l_statuses text[];
    l_leases timestamptz[];
    l_cancels boolean[];
    r record;
BEGIN
    IF p_ttl IS NULL OR p_ttl = 'NaN'::float8 OR p_ttl < 0 OR p_ttl > 31536000 THEN
        RAISE EXCEPTION 'result_ttl_seconds is out of range'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF p_owner IS NULL OR p_owner = '' OR pg_catalog.length(p_owner) > 255 THEN
        RAISE EXCEPTION 'worker_id must be a non-empty string of at most 255 characters'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    IF v_count IS NULL OR v_count < 1 OR v_count > 1000
       OR pg_catalog.array_ndims(p_ids) <> 1
       OR pg_catalog.array_ndims(p_generations) IS DISTINCT FROM 1
       OR pg_catalog.array_ndims(p_tokens) IS DISTINCT FROM 1
       OR pg_catalog.array_ndims(p_queues) IS DISTINCT FROM 1
       OR pg_catalog.array_ndims(p_results) IS DISTINCT FROM 1
       OR pg_catalog.cardinality(p_generations) <> v_count
       OR pg_catalog.cardinality(p_tokens) <> v_count
       OR pg_catalog.cardinality(p_queues) <> v_count
       OR pg_catalog.cardinality(p_results) <> v_count
       OR pg_catalog.array_lower(p_ids, 1) <> 1
       OR pg_catalog.array_lower(p_generations, 1) <> 1
       OR pg_catalog.array_lower(p_tokens, 1) <> 1
       OR pg_catalog.array_lower(p_queues, 1) <> 1
       OR pg_catalog.array_lower(p_results, 1) <> 1 THEN
        RAISE EXCEPTION 'job_ids, generations, claim_tokens, queues and results must be arrays of one length, 1 to 1000'
            USING ERRCODE = '22023', HINT = 'CONFIG';
    END IF;
    FOR v_i IN 1 .. v_count LOOP
        IF p_tokens[v_i] IS NULL OR p_tokens[v_i] = '' OR pg_catalog.length(p_tokens[v_i]) > 255 THEN
            RAISE EXCEPTION 'claim_token must be a non-empty string of at most 255 characters'
                USING ERRCODE = '22023', HINT = 'CONFIG';
        END IF;
        IF p_generations[v_i] IS NULL OR p_generations[v_i] < 1 OR p_queues[v_i] IS NULL
           OR p_ids[v_i] IS NULL THEN
            RAISE EXCEPTION 'invalid fence' USING ERRCODE = '22023', HINT = 'CONFIG';
        END IF;
    END LOOP;

    v_done := pg_catalog.array_fill(false, ARRAY[v_count]);
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'on', true);
    IF v_count = 1 THEN
        -- One job: version 2's path (measured cheaper for a batch of one).
        FOR v_i IN
            SELECT o.i FROM pg_catalog.unnest(p_ids) WITH ORDINALITY AS o(id, i)
             ORDER BY o.id COLLATE "C", o.i
        LOOP
            SELECT j.id, j.queue, j.claim_owner, j.claim_generation, j.claim_token, j.status,
                   j.lease_expires_at, j.cancel_requested
              INTO r
              FROM {schema}.soniq_jobs AS j
             WHERE j.id = p_ids[v_i]::uuid
               FOR UPDATE;
            v_now := pg_catalog.clock_timestamp();  -- after the lock
            IF NOT FOUND
               OR r.id::text COLLATE "C" <> p_ids[v_i] COLLATE "C"
               OR r.queue COLLATE "C" <> p_queues[v_i] COLLATE "C"
               OR r.claim_owner IS NULL OR r.claim_owner COLLATE "C" <> p_owner COLLATE "C"
               OR r.claim_token IS NULL OR r.claim_token COLLATE "C" <> p_tokens[v_i] COLLATE "C"
               OR r.claim_generation <> p_generations[v_i]
               OR r.status <> 'processing'
               OR r.lease_expires_at IS NULL OR r.lease_expires_at <= v_now
               OR r.cancel_requested THEN
                CONTINUE;
            END IF;
            UPDATE {schema}.soniq_jobs AS j
               SET status = 'done', result = p_results[v_i],
                   lease_expires_at = NULL, pid = NULL,
                   expires_at = v_now + pg_catalog.make_interval(secs => p_ttl),
                   updated_at = v_now
             WHERE j.id = r.id
               AND (j.claim_token = p_tokens[v_i]
                    AND j.claim_generation = p_generations[v_i]
                    AND j.status = 'processing' AND j.lease_expires_at > v_now
                    AND NOT j.cancel_requested) IS TRUE;
            v_done[v_i] := FOUND;
        END LOOP;
    ELSE
        -- Version 7: several jobs, two statements. First lock every row the
        -- batch names, in id order (the order version 2 locks them in, so
        -- two batches sharing rows cannot deadlock), and read each fence
        -- under its lock.
        v_ids := p_ids::uuid[];
        SELECT pg_catalog.array_agg(k.tid), pg_catalog.array_agg(k.id),
               pg_catalog.array_agg(k.queue), pg_catalog.array_agg(k.claim_owner),
               pg_catalog.array_agg(k.claim_generation), pg_catalog.array_agg(k.claim_token),
               pg_catalog.array_agg(k.status), pg_catalog.array_agg(k.lease_expires_at),
               pg_catalog.array_agg(k.cancel_requested)
          INTO l_tids, l_ids, l_queues, l_owners, l_generations, l_tokens, l_statuses,
               l_leases, l_cancels
          FROM (SELECT j.ctid AS tid, j.id, j.queue, j.claim_owner, j.claim_generation,
                       j.claim_token, j.status, j.lease_expires_at, j.cancel_requested
                  FROM {schema}.soniq_jobs AS j
                 WHERE j.id = ANY (v_ids)
                 ORDER BY j.id
                   FOR UPDATE) AS k;
        v_now := pg_catalog.clock_timestamp();  -- after the locks
        -- Then one UPDATE. Each element is checked against its own whole
        -- fence as version 2 checks it, against the row as locked and the
        -- time read after every lock; of the elements naming one row, the
        -- first (in input order) whose fence holds is the one written, as
        -- version 2's loop (which takes them in that order, and after
        -- whose write the row is no longer processing) writes it. The rows
        -- are matched by the ctid read under the lock, which cannot change
        -- before this transaction ends. The predicate is repeated on the
        -- row written, as one IS TRUE: the planner takes no index for it.
        WITH w AS (
            UPDATE {schema}.soniq_jobs AS j
               SET status = 'done', result = u.result,
                   lease_expires_at = NULL, pid = NULL,
                   expires_at = v_now + pg_catalog.make_interval(secs => p_ttl),
                   updated_at = v_now
              FROM (SELECT DISTINCT ON (l.id) l.tid, o.i, o.token, o.generation, o.result
                      FROM ROWS FROM (pg_catalog.unnest(p_ids), pg_catalog.unnest(p_generations),
                                      pg_catalog.unnest(p_tokens), pg_catalog.unnest(p_queues),
                                      pg_catalog.unnest(p_results))
                           WITH ORDINALITY AS o(id, generation, token, queue, result, i)
                      JOIN ROWS FROM (pg_catalog.unnest(l_tids), pg_catalog.unnest(l_ids),
                                      pg_catalog.unnest(l_queues), pg_catalog.unnest(l_owners),
                                      pg_catalog.unnest(l_generations),
                                      pg_catalog.unnest(l_tokens), pg_catalog.unnest(l_statuses),
                                      pg_catalog.unnest(l_leases), pg_catalog.unnest(l_cancels))
                           AS l(tid, id, queue, claim_owner, claim_generation, claim_token,
                                status, lease_expires_at, cancel_requested)
                        ON l.id::text COLLATE "C" = o.id COLLATE "C"
                     WHERE (l.queue COLLATE "C" = o.queue COLLATE "C"
                            AND l.claim_owner COLLATE "C" = p_owner COLLATE "C"
                            AND l.claim_token COLLATE "C" = o.token COLLATE "C"
                            AND l.claim_generation = o.generation
                            AND l.status = 'processing'
                            AND l.lease_expires_at > v_now
                            AND NOT l.cancel_requested) IS TRUE
                     ORDER BY l.id, o.i) AS u
             WHERE j.ctid = u.tid
               AND (j.claim_token = u.token
                    AND j.claim_generation = u.generation
                    AND j.status = 'processing' AND j.lease_expires_at > v_now
                    AND NOT j.cancel_requested) IS TRUE
            RETURNING u.i)
        SELECT pg_catalog.array_agg(w.i) INTO v_hits FROM w;
        IF v_hits IS NOT NULL THEN
            FOREACH v_i IN ARRAY v_hits LOOP
                v_done[v_i] := true;
            END LOOP;
        END IF;
    END IF;
    -- Version 8: the gate closes before returning, as version 2's did
    -- (version 7 left it open for the rest of the caller's transaction, so
    -- that an id-only DELETE of an owned submission then went through). An
    -- error on the way undoes the setting with everything else.
    PERFORM pg_catalog.set_config('soniq.fenced_write', 'off', true);
    RETURN v_done;
END
$fn$;

-- soniq_claim_many: no sort where an index gives the claim order, no JIT --
ALTER FUNCTION {schema}.soniq_claim_many(text, text[], text[], double precision,
                                         double precision, integer)
    SET enable_sort = off SET jit = off;
