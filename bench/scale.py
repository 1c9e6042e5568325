"""What a claim costs as the queue grows, and as workers multiply: ``python -m bench.scale``.

Five parts (issues 17, 27, 29 and 31, docs/performance.md "Scale"), against
databases of its own, ``soniq_bench_<pid>_scale*``, dropped at the end:

1. **Depth.** For each depth N (10k, 100k, 1M): the table is bulk-loaded
   with N queued jobs, plus 100k jobs scheduled a day ahead and 100k
   finished-but-unexpired rows, their ``created_at`` spread over the queued
   jobs' (mixed in, as an application that schedules jobs all day would
   have them), in one INSERT ... SELECT writing the columns
   soniq_enqueue()/soniq_complete() write; then VACUUM ANALYZE and a
   CHECKPOINT. Measured: the claim's plan (auto_explain inside the
   function, so the plan PL/pgSQL really runs, with buffers), the claim's
   cost per call (client-timed median with synchronous_commit off, and the
   server's own time from pg_stat_user_functions), and claim→complete
   throughput with K connections (bench/raw.py's fenced rows). Then 50k
   more jobs are queued ahead of the others and drained without a vacuum,
   leaving their dead tuples in the claim index, and the same is measured
   again. Target: the per-claim cost at 1M within 1.5× of 10k.
2. **Finished rows** (``--finished N``, ``make bench-finished``; issue 27):
   100k queued jobs alone, and the same beside N finished rows kept for
   their result TTL (``done``, with a result, their claim columns as a
   completion leaves them), in two databases. Measured as in part 1: the
   claim's plan, its cost per call (interleaved, server time), claim→complete
   throughput, and each table's and index's size. Target: the per-claim
   cost beside 10M finished rows within 1.2× of none.
3. **Workers.** P = 1, 2, 4, 8 ``soniq_worker --burst`` processes drain
   one preloaded queue. Measured: the drain rate, CPU per job of the worker
   processes and of their PostgreSQL backends (/proc/<pid>/stat, from the
   first claim to the empty queue), and pg_stat_activity sampled every
   20 ms: the wait events of the active backends, and which statement waits
   on a heavyweight lock (a claim, a completion, the throughput counter's
   upsert, the reaper).
4. **Waiting dependents** (``--waiting N``, default 100k; issue 29 item 3).
   10k queued jobs (and 1,000 jobs scheduled a day ahead) alone, and the
   same beside N jobs waiting for those 1,000 (``soniq_enqueue_after``, one
   dependency each: queued rows scheduled at 9999-01-01, with their
   dependency and waits rows), in two databases. Measured as in part 2: the
   claim's plan, its cost per call (interleaved, server time), claim→complete
   throughput of the 10k, sizes. Target: the per-claim cost beside 100k
   waiting dependents within 1.2× of none (the claim's cost must not grow
   with the number of waiting dependents).
5. **Held-back keyed jobs** (``--keyed N``, default 100k; quick 20k; issue 31
   item 2). Plain jobs alone, the same beside N keyed jobs held back over
   1,000 keys (each key at a limit of 1, its one offered job claimed and left
   running; bench/keys.py's ``load_held``), and keyed jobs whose keys each
   offer one, in three databases. Measured as in part 4: the claim's plan, its
   cost per call (interleaved, server time). Target: the per-claim cost
   beside N held-back keyed jobs within 1.2× of none (a claim reads no
   held-back job); the claim of a keyed job (its key's trigger) is shown
   beside them.
"""

import argparse
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from bench import keys as key_bench
from bench import raw
from bench.common import connect, create_database, drop_database, percentile, read_stamps
from bench.run import PROJECT_PY, ROOT, System, _on_signal, _stop_children, run_workers

CLAIM = "SELECT job_id, queue, generation FROM soniq_claim(%s, %s)"
CLAIM_MANY = "SELECT job_id, queue, generation FROM soniq_claim_many(%s, %s::text[])"
COMPLETE_MANY = ("SELECT soniq_complete_many(%s::text[], %s, %s::bigint[], %s::text[], %s::text[], "
                 "%s::jsonb[], 300)")

#: The rows of one depth, in one statement: queued jobs 1 µs apart (as separate
#: enqueues would be), scheduled and finished rows spread over the same span.
LOAD_SQL = """
INSERT INTO soniq_jobs (id, job_name, args, status, attempts, max_attempts, queue, priority,
                        unique_job, producer_id, scheduled_at, created_at, updated_at,
                        claim_generation, claim_owner, claim_token, expires_at)
SELECT * FROM (
    SELECT gen_random_uuid(), 'bench.noop', jsonb_build_object('i', g), 'queued', 0, 4,
           'default', 100, false, 'bench', NULL::timestamptz,
           %(t0)s::timestamptz + g * interval '1 microsecond', now(), 0::bigint, NULL, NULL,
           NULL::timestamptz
      FROM generate_series(1, %(queued)s) AS g
    UNION ALL
    SELECT gen_random_uuid(), 'bench.noop', jsonb_build_object('f', g), 'queued', 0, 4,
           'default', 100, false, 'bench', now() + interval '1 day' + g * interval '1 ms',
           %(t0)s::timestamptz + (g::bigint * %(queued)s / greatest(%(future)s, 1)) * interval '1 microsecond',
           now(), 0, NULL, NULL, NULL
      FROM generate_series(1, %(future)s) AS g WHERE %(future)s > 0
    UNION ALL
    SELECT gen_random_uuid(), 'bench.noop', jsonb_build_object('d', g), 'done', 1, 4,
           'default', 100, false, 'bench', NULL,
           %(t0)s::timestamptz + (g::bigint * %(queued)s / greatest(%(done)s, 1)) * interval '1 microsecond',
           now(), 1, 'bench-done', 'bench-done-' || g, now() + interval '1 day'
      FROM generate_series(1, %(done)s) AS g WHERE %(done)s > 0
) AS rows ORDER BY 12
"""

#: Jobs queued ahead of all others (older created_at), to be drained without a vacuum.
HEAD_SQL = """
INSERT INTO soniq_jobs (id, job_name, args, status, attempts, max_attempts, queue, priority,
                        unique_job, producer_id, created_at, updated_at)
SELECT gen_random_uuid(), 'bench.noop', jsonb_build_object('h', g), 'queued', 0, 4, 'default',
       100, false, 'bench', %(t0)s::timestamptz - interval '1 hour' + g * interval '1 microsecond',
       now()
  FROM generate_series(1, %(count)s) AS g
"""

#: Finished rows kept for their result TTL, created before the queued jobs (as the
#: jobs a queue has run are), in batches of ``count``: done, with a small result, their
#: claim columns as soniq_complete() leaves them.
FINISHED_SQL = """
INSERT INTO soniq_jobs (id, job_name, args, status, attempts, max_attempts, queue, priority,
                        unique_job, producer_id, created_at, updated_at, claimed_at,
                        claim_generation, claim_owner, claim_token, result, expires_at)
SELECT gen_random_uuid(), 'bench.noop', jsonb_build_object('d', g), 'done', 1, 4, 'default',
       100, false, 'bench', %(t0)s::timestamptz - interval '1 day' + g * interval '1 microsecond',
       now(), now(), 1, 'bench-done', 'bench-done-' || %(offset)s || '-' || g,
       jsonb_build_object('ok', true, 'rows', g), now() + interval '1 day'
  FROM generate_series(1, %(count)s) AS g
"""

RESET_SQL = ("TRUNCATE soniq_jobs, soniq_dead_letter_jobs, soniq_workers, soniq_throughput, "
             "soniq_queue_settings, soniq_queue_starts, soniq_job_dependencies, soniq_job_waits")

#: Jobs waiting for the jobs scheduled a day ahead, through the SQL API (as an
#: application's depends_on writes them): one dependency each, round robin.
WAITING_SQL = """
WITH deps AS (SELECT array_agg(id ORDER BY id) AS ids FROM soniq_jobs
               WHERE status = 'queued' AND scheduled_at IS NOT NULL)
SELECT count(soniq_enqueue_after(ARRAY[deps.ids[1 + g %% cardinality(deps.ids)]],
                                 'bench.noop', jsonb_build_object('w', g)))
  FROM deps, generate_series(1, %(count)s) AS g
"""
QUEUED_SQL = "SELECT count(*) FROM soniq_jobs WHERE status = 'queued' AND scheduled_at IS NULL"


# Part 1: depth ----------------------------------------------------------------


def load(db: str, queued: int, future: int, done: int) -> float:
    """Truncate, bulk-load one depth, VACUUM ANALYZE, CHECKPOINT; return seconds taken."""
    started = time.perf_counter()
    with connect(db) as conn:
        conn.execute(RESET_SQL)
        conn.execute(LOAD_SQL, {"t0": "2026-01-01T00:00:00Z", "queued": queued,
                                "future": future, "done": done})
        conn.execute("VACUUM ANALYZE soniq_jobs")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def _plan_summary(plan: str) -> dict:
    """Index used, rows the scan read and threw away, buffers, time, of one claim plan."""
    indexes = re.findall(r"Index (?:Only )?Scan(?: Backward)? using (\S+)", plan)
    seq = re.findall(r"Seq Scan on (\S+)", plan)
    removed = sum(int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", plan))
    buffers = re.search(r"Buffers: shared( hit=(\d+))?( read=(\d+))?( dirtied=(\d+))?", plan)
    hit = int(buffers.group(2) or 0) if buffers else 0
    read = int(buffers.group(4) or 0) if buffers else 0
    took = re.search(r"actual time=[\d.]+\.\.([\d.]+)", plan)
    return {"index": ",".join(dict.fromkeys(indexes)) or ("seq " + ",".join(seq) if seq else "?"),
            "removed": removed, "hit": hit, "read": read,
            "ms": float(took.group(1)) if took else float("nan")}


def claim_plan(db: str, warmup: int = 8) -> tuple[str, dict]:
    """The plan of the claim's job-picking statement, as PL/pgSQL runs it after ``warmup``
    calls (it may have switched to a generic plan by then), with actual rows and buffers.

    auto_explain logs the nested statements of one soniq_claim() call at NOTICE level;
    every call here is rolled back, so no job is taken.
    """
    owner = str(uuid.uuid4())
    notices: list[str] = []
    with connect(db) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        for i in range(warmup + 1):
            if i == warmup:
                for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                                "SET auto_explain.log_analyze = on",
                                "SET auto_explain.log_buffers = on",
                                "SET auto_explain.log_timing = on",
                                "SET auto_explain.log_nested_statements = on",
                                "SET auto_explain.log_level = notice"):
                    conn.execute(setting)
            with conn.transaction(force_rollback=True):
                conn.execute(CLAIM, [owner, secrets.token_hex(16)], prepare=True).fetchall()
    picks = [n for n in notices if "FOR UPDATE SKIP LOCKED" in n and "ORDER BY" in n]
    if not picks:
        raise RuntimeError("auto_explain showed no claim statement:\n" + "\n".join(notices))
    lines = picks[0].splitlines()
    start = next((i for i, line in enumerate(lines) if "(cost=" in line), 0)
    plan = "\n".join(line for line in lines[start:] if line.strip())
    return plan, _plan_summary(plan)


def _function_time(conn) -> tuple[int, float]:
    """(calls, total ms) of soniq_claim_many so far, this database (track_functions)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT coalesce(sum(calls), 0), coalesce(sum(total_time), 0) "
                       "FROM pg_stat_user_functions WHERE funcname = 'soniq_claim_many'"
                       ).fetchone()
    return int(row[0]), float(row[1])


def claim_costs(dbs: list[str], count: int, chunk: int = 20) -> dict[str, dict]:
    """Per-claim cost in each database: ``count`` soniq_claim() calls on one connection per
    database, each followed by its (untimed) completion, synchronous_commit off.

    The databases take turns in chunks of ``chunk`` calls, so that all of them see the
    same machine (it is shared, and its load drifts within minutes). Client-timed median
    and p90, and the server's mean time inside soniq_claim_many (pg_stat_user_functions).
    """
    owner = str(uuid.uuid4())
    conns = {db: connect(db) for db in dbs}
    stats = {db: connect(db) for db in dbs}
    samples: dict[str, list[float]] = {db: [] for db in dbs}
    before: dict[str, tuple[int, float]] = {}
    try:
        for db, conn in conns.items():
            conn.execute("SET synchronous_commit = off")
            conn.execute("SET track_functions = 'all'")

        def one(db: str, timed: bool) -> None:
            conn = conns[db]
            token = secrets.token_hex(16)
            started = time.perf_counter()
            row = conn.execute(CLAIM, [owner, token], prepare=True).fetchone()
            spent = time.perf_counter() - started
            if row is None:
                raise RuntimeError("the queue ran dry during the claim timing")
            if timed:
                samples[db].append(spent * 1000)
            job_id, queue, generation = row
            conn.execute(raw.SONIQ_COMPLETE, [str(job_id), owner, generation, token, queue],
                         prepare=True)

        for db in dbs:  # five each to prepare and warm up, untimed
            for _ in range(5):
                one(db, False)
            conns[db].execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.05)
        before = {db: _function_time(stats[db]) for db in dbs}
        done = 0
        while done < count:
            n = min(chunk, count - done)
            for db in dbs:
                for _ in range(n):
                    one(db, True)
            done += n
        for conn in conns.values():
            conn.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.05)
        found = {}
        for db in dbs:
            calls, total = _function_time(stats[db])
            calls -= before[db][0]
            found[db] = {"median": statistics.median(samples[db]),
                         "p90": percentile(samples[db], 0.9),
                         "server": (total - before[db][1]) / calls if calls else float("nan"),
                         "calls": calls}
        return found
    finally:
        for conn in [*conns.values(), *stats.values()]:
            conn.close()


def throughput(db: str, connections: int, jobs: int) -> float:
    """claim→complete jobs/s over ``jobs`` jobs shared by ``connections`` threads (sync commit
    as configured: what a worker pays)."""
    left = [jobs]
    lock = threading.Lock()
    owner = str(uuid.uuid4())

    def one_job(conn) -> bool:
        with lock:
            if left[0] <= 0:
                return False
            left[0] -= 1
        token = secrets.token_hex(16)
        row = conn.execute(raw.SONIQ_CLAIM, [owner, token], prepare=True).fetchone()
        if row is None:
            raise RuntimeError("the queue ran dry during the throughput run")
        job_id, queue, generation = row
        (ok,) = conn.execute(raw.SONIQ_COMPLETE, [str(job_id), owner, generation, token, queue],
                             prepare=True).fetchone()
        assert ok, "soniq_complete refused a live claim"
        return True

    return raw._drain_threads(db, connections, None, one_job)["rate"]


def drain_head(db: str, count: int, batch: int = 100) -> float:
    """Queue ``count`` jobs ahead of all others and drain them (claim_many/complete_many),
    no vacuum after; return seconds the drain took."""
    owner = str(uuid.uuid4())
    with connect(db) as conn:
        conn.execute(HEAD_SQL, {"t0": "2026-01-01T00:00:00Z", "count": count})
        conn.execute("SET synchronous_commit = off")
        started = time.perf_counter()
        done = 0
        while done < count:
            tokens = [secrets.token_hex(16) for _ in range(min(batch, count - done))]
            rows = conn.execute(CLAIM_MANY, [owner, tokens], prepare=True).fetchall()
            if len(rows) != len(tokens):
                raise RuntimeError("the head drain ran dry")
            conn.execute(COMPLETE_MANY, [[str(r[0]) for r in rows], owner, [r[2] for r in rows],
                                         tokens, [r[1] for r in rows], [None] * len(rows)],
                         prepare=True)
            done += len(rows)
        return time.perf_counter() - started


def dead_tuples(db: str) -> int:
    with connect(db) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
    time.sleep(0.6)
    with connect(db) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(conn.execute("SELECT n_dead_tup FROM pg_stat_user_tables "
                                "WHERE relname = 'soniq_jobs'").fetchone()[0])


def measure_depths(cfg, cases: list[dict]) -> None:
    """Every case (a database with one depth loaded) fresh, then after a drain without
    vacuum (the mixed ones): plans, interleaved per-claim costs, throughput."""
    for case in cases:
        case["load_s"] = load(case["db"], case["depth"], cfg.future if case["mixed"] else 0,
                              cfg.done if case["mixed"] else 0)
        print(f"scale: {case['label']} loaded in {case['load_s']:.1f} s", flush=True)
    for phase in ("fresh", "drained"):
        taking = [c for c in cases if phase == "fresh" or c["mixed"]]
        if phase == "drained":
            for case in taking:
                case["head_s"] = drain_head(case["db"], cfg.head)
                case["dead"] = dead_tuples(case["db"])
        plans = {c["db"]: claim_plan(c["db"]) for c in taking}
        costs = claim_costs([c["db"] for c in taking], cfg.claims)
        for case in taking:
            rate = throughput(case["db"], cfg.connections, cfg.throughput_jobs)
            plan, summary = plans[case["db"]]
            cost = costs[case["db"]]
            case[phase] = {"plan": plan, "summary": summary, "cost": cost, "rate": rate}
            print(f"scale:   {case['label']:<12} {phase:<8} claim {cost['median']:.3f} ms "
                  f"(server {cost['server']:.3f}), {rate:,.0f} jobs/s, plan {summary['index']} "
                  f"hit={summary['hit']} removed={summary['removed']}", flush=True)


# Part 2: finished rows --------------------------------------------------------


def load_finished(db: str, queued: int, finished: int, batch: int = 1_000_000) -> float:
    """Truncate, load ``finished`` finished rows (in batches) and ``queued`` jobs, VACUUM
    ANALYZE, CHECKPOINT; return seconds taken."""
    started = time.perf_counter()
    load(db, queued, 0, 0)
    with connect(db) as conn:
        for offset in range(0, finished, batch):
            conn.execute(FINISHED_SQL, {"t0": "2026-01-01T00:00:00Z", "offset": offset,
                                        "count": min(batch, finished - offset)})
        if finished:
            conn.execute("VACUUM ANALYZE soniq_jobs")
            conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def relation_sizes(db: str) -> dict[str, int]:
    """Bytes of soniq_jobs and of each of its indexes."""
    with connect(db) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class AS c "
            " WHERE c.oid = 'soniq_jobs'::regclass OR c.oid IN ("
            "   SELECT indexrelid FROM pg_index WHERE indrelid = 'soniq_jobs'::regclass) "
            " ORDER BY 2 DESC").fetchall()
    return {name: size for name, size in rows}


def measure_finished(cfg, cases: list[dict]) -> None:
    """Both cases loaded, then plans, interleaved per-claim costs, throughput, sizes."""
    for case in cases:
        case["load_s"] = load_finished(case["db"], cfg.finished_queued, case["finished"])
        print(f"scale: {case['label']} loaded in {case['load_s']:.1f} s", flush=True)
    plans = {c["db"]: claim_plan(c["db"]) for c in cases}
    costs = claim_costs([c["db"] for c in cases], cfg.claims)
    for case in cases:
        rate = throughput(case["db"], cfg.connections, cfg.throughput_jobs)
        plan, summary = plans[case["db"]]
        case.update(plan=plan, summary=summary, cost=costs[case["db"]], rate=rate,
                    sizes=relation_sizes(case["db"]))
        print(f"scale:   {case['label']:<24} claim {case['cost']['median']:.3f} ms (server "
              f"{case['cost']['server']:.3f}), {rate:,.0f} jobs/s, plan {summary['index']} "
              f"hit={summary['hit']} read={summary['read']}", flush=True)


def render_finished(cfg, cases: list[dict]) -> list[str]:
    alone, beside = cases
    out = [f"FINISHED ROWS (issue 27: {cfg.finished_queued:,} queued alone, and beside "
           f"{beside['finished']:,} finished rows kept for their result; claim = soniq_claim() "
           "alone, one connection, synchronous_commit off; throughput = claim+complete, "
           f"{cfg.connections} connections, {cfg.throughput_jobs:,} jobs)"]
    out.append(f"  {'case':<28} {'claim ms':>9} {'p90':>7} {'server ms':>9} {'jobs/s':>8}  "
               "plan: index, buffers hit/read, ms; loaded in")
    for case in cases:
        c, s = case["cost"], case["summary"]
        out.append(f"  {case['label']:<28} {c['median']:>9.3f} {c['p90']:>7.3f} "
                   f"{c['server']:>9.3f} {case['rate']:>8,.0f}  {s['index']}, "
                   f"{s['hit']}/{s['read']}, {s['ms']:.3f}; {case['load_s']:.0f} s")
    out.append("  sizes (MB), alone → beside:")
    for name, size in beside["sizes"].items():
        out.append(f"    {name:<40} {alone['sizes'].get(name, 0) / 1e6:>9.1f} → {size / 1e6:>9.1f}")
    ratio = beside["cost"]["server"] / alone["cost"]["server"]
    client = beside["cost"]["median"] / alone["cost"]["median"]
    out.append(f"  per-claim cost beside {beside['finished']:,} finished rows ÷ none (server time; "
               f"client-timed median in brackets): {ratio:.2f}× ({client:.2f}×)  target ≤1.20×: "
               f"{_verdict(ratio, 1.2)}")
    rate = beside["rate"] / alone["rate"]
    out.append(f"  claim+complete throughput beside ÷ none: {rate:.2f}×  target ≥0.83× "
               f"(1 ÷ 1.2): {'met' if rate >= 1 / 1.2 else 'MISSED'}")
    out.append("")
    out.append(f"CLAIM PLAN BESIDE {beside['finished']:,} FINISHED ROWS (auto_explain inside "
               "soniq_claim, after 8 calls)")
    out.extend("  " + line for line in beside["plan"].splitlines())
    return out


# Part 4: waiting dependents --------------------------------------------------------


def load_waiting(db: str, queued: int, waiting: int, batch: int = 20_000) -> float:
    """Truncate, load ``queued`` jobs and 1,000 scheduled a day ahead, then ``waiting`` jobs
    depending on those (in batches), VACUUM ANALYZE, CHECKPOINT; return seconds taken."""
    started = time.perf_counter()
    load(db, queued, 1000, 0)
    with connect(db) as conn:
        for offset in range(0, waiting, batch):
            conn.execute(WAITING_SQL, {"count": min(batch, waiting - offset)})
        if waiting:
            found = conn.execute("SELECT count(*) FROM soniq_jobs WHERE status = 'queued' "
                                 "AND scheduled_at >= '9999-01-01'").fetchone()[0]
            if found != waiting:
                raise RuntimeError(f"{found} waiting jobs loaded, not {waiting}")
            conn.execute("VACUUM ANALYZE")
            conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def measure_waiting(cfg, cases: list[dict]) -> None:
    """Both cases loaded, then plans, interleaved per-claim costs, throughput, sizes."""
    for case in cases:
        case["load_s"] = load_waiting(case["db"], cfg.waiting_queued, case["waiting"])
        print(f"scale: {case['label']} loaded in {case['load_s']:.1f} s", flush=True)
    plans = {c["db"]: claim_plan(c["db"]) for c in cases}
    costs = claim_costs([c["db"] for c in cases], cfg.claims)
    for case in cases:
        rate = throughput(case["db"], cfg.connections, cfg.throughput_jobs)
        plan, summary = plans[case["db"]]
        case.update(plan=plan, summary=summary, cost=costs[case["db"]], rate=rate,
                    sizes=relation_sizes(case["db"]))
        with connect(case["db"]) as conn:
            left = conn.execute("SELECT count(*) FROM soniq_jobs WHERE scheduled_at >= "
                                "'9999-01-01' AND status = 'queued'").fetchone()[0]
        if left != case["waiting"]:
            raise RuntimeError(f"{case['label']}: {left} jobs still waiting, not "
                               f"{case['waiting']}: a claim took a waiting job")
        print(f"scale:   {case['label']:<32} claim {case['cost']['median']:.3f} ms (server "
              f"{case['cost']['server']:.3f}), {rate:,.0f} jobs/s, plan {summary['index']} "
              f"hit={summary['hit']} read={summary['read']}", flush=True)


def render_waiting(cfg, cases: list[dict]) -> list[str]:
    alone, beside = cases
    out = [f"WAITING DEPENDENTS (issue 29: {cfg.waiting_queued:,} queued and 1,000 scheduled "
           f"alone, and beside {beside['waiting']:,} jobs waiting for the scheduled ones; "
           "claim = soniq_claim() alone, one connection, synchronous_commit off; "
           f"throughput = claim+complete, {cfg.connections} connections, "
           f"{cfg.throughput_jobs:,} jobs)"]
    out.append(f"  {'case':<34} {'claim ms':>9} {'p90':>7} {'server ms':>9} {'jobs/s':>8}  "
               "plan: index, buffers hit/read, ms; loaded in")
    for case in cases:
        c, s = case["cost"], case["summary"]
        out.append(f"  {case['label']:<34} {c['median']:>9.3f} {c['p90']:>7.3f} "
                   f"{c['server']:>9.3f} {case['rate']:>8,.0f}  {s['index']}, "
                   f"{s['hit']}/{s['read']}, {s['ms']:.3f}; {case['load_s']:.0f} s")
    out.append("  soniq_jobs sizes (MB), alone → beside:")
    for name, size in beside["sizes"].items():
        out.append(f"    {name:<40} {alone['sizes'].get(name, 0) / 1e6:>9.1f} → {size / 1e6:>9.1f}")
    ratio = beside["cost"]["server"] / alone["cost"]["server"]
    client = beside["cost"]["median"] / alone["cost"]["median"]
    out.append(f"  per-claim cost beside {beside['waiting']:,} waiting dependents ÷ none (server "
               f"time; client-timed median in brackets): {ratio:.2f}× ({client:.2f}×)  target "
               f"≤1.20×: {_verdict(ratio, 1.2)}")
    rate = beside["rate"] / alone["rate"]
    out.append(f"  claim+complete throughput beside ÷ none: {rate:.2f}×  target ≥0.83× "
               f"(1 ÷ 1.2): {'met' if rate >= 1 / 1.2 else 'MISSED'}")
    out.append("")
    out.append(f"CLAIM PLAN BESIDE {beside['waiting']:,} WAITING DEPENDENTS (auto_explain inside "
               "soniq_claim, after 8 calls)")
    out.extend("  " + line for line in beside["plan"].splitlines())
    return out


# Part 3: workers ----------------------------------------------------------------


def _cpu_ticks(pid: int) -> int | None:
    """utime + stime of ``pid`` (all its threads), in clock ticks; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None


def classify(query: str) -> str:
    """Which soniq statement a backend is running, for the wait table."""
    for needle, kind in (("soniq_claim", "claim"), ("soniq_complete", "complete"),
                         ("soniq_throughput", "throughput counter"), ("soniq_heartbeat", "heartbeat"),
                         ("soniq_reap", "reaper"), ("soniq_workers", "worker row"),
                         ("soniq_set_pid", "set_pid"), ("expires_at", "housekeeping")):
        if needle in query:
            return kind
    return "other"


class Sampler(threading.Thread):
    """Every ``period`` s: pg_stat_activity of the database's client backends (wait events,
    statements), and CPU ticks of every backend and worker process seen."""

    def __init__(self, db: str, ignore: int, period: float = 0.02):
        super().__init__(daemon=True)
        self.db = db
        self.ignore = ignore
        self.period = period
        self.stop = threading.Event()
        self.recording = threading.Event()
        self.waits: Counter[str] = Counter()
        self.lock_waits: Counter[str] = Counter()
        self.kinds: Counter[str] = Counter()
        self.samples = 0
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.worker_pids: list[int] = []
        self.error: BaseException | None = None

    def _ticks(self, pids) -> None:
        for pid in pids:
            ticks = _cpu_ticks(pid)
            if ticks is not None:
                self.first.setdefault(pid, ticks)
                self.last[pid] = ticks

    def run(self) -> None:
        try:
            with connect(self.db) as conn:
                me = conn.info.backend_pid
                while not self.stop.is_set():
                    rows = conn.execute(
                        "SELECT pid, state, wait_event_type, wait_event, query "
                        "FROM pg_stat_activity WHERE datname = current_database() "
                        "AND backend_type = 'client backend' AND pid <> ALL (%s)",
                        [[me, self.ignore]]).fetchall()
                    if self.recording.is_set():
                        self.samples += 1
                        self._ticks([r[0] for r in rows])
                        self._ticks(self.worker_pids)
                        for _, state, wtype, wevent, query in rows:
                            if state != "active":
                                continue
                            kind = classify(query or "")
                            self.kinds[kind] += 1
                            event = f"{wtype}:{wevent}" if wtype else "CPU (no wait)"
                            self.waits[event] += 1
                            if wtype == "Lock":
                                self.lock_waits[f"{kind} on {wevent}"] += 1
                    time.sleep(self.period)
        except BaseException as error:  # reported by the caller
            self.error = error

    def cpu_ms(self, pids) -> float:
        ticks = sum(self.last[p] - self.first[p] for p in pids if p in self.first)
        return ticks * 1000 / os.sysconf("SC_CLK_TCK")


def measure_workers(cfg, system: System, processes: int) -> dict:
    with connect(system.db) as conn:
        conn.execute(RESET_SQL)
    system.preload(cfg.worker_jobs)
    with connect(system.db) as conn:
        conn.execute("VACUUM ANALYZE soniq_jobs")
        conn.execute("CHECKPOINT")
    stamps_dir = Path(tempfile.mkdtemp(prefix="stamps-", dir=system.log_dir))
    watch = connect(system.db)  # how many are queued, every 50 ms (not a worker's backend)
    sampler = Sampler(system.db, ignore=watch.info.backend_pid)
    sampler.start()
    state: dict = {"first": None, "done": None}

    def until(procs) -> bool:
        if not sampler.worker_pids:
            sampler.worker_pids = [p.pid for p in procs]
            sampler._ticks(sampler.worker_pids)
        queued = watch.execute(QUEUED_SQL).fetchone()[0]
        if queued < cfg.worker_jobs and state["first"] is None:
            state["first"] = time.perf_counter()
            sampler.first.clear()  # CPU from the first claim on: not the processes' start-up
            sampler.recording.set()
        if queued == 0 and state["done"] is None:
            state["done"] = time.perf_counter()
            sampler.recording.clear()
        return all(child.poll() is not None for child in procs)

    try:
        run_workers(system, cfg.worker_concurrency, processes, "drain", stamps_dir, until=until,
                    timeout=600)
    finally:
        sampler.stop.set()
        sampler.join()
        watch.close()
    if sampler.error:
        raise sampler.error
    stamps = sorted(read_stamps(str(stamps_dir)))
    shutil.rmtree(stamps_dir, ignore_errors=True)
    finished = system.sql(system.done_sql)
    if finished != cfg.worker_jobs or len(stamps) != cfg.worker_jobs:
        raise RuntimeError(f"workers drained {finished} of {cfg.worker_jobs} jobs")
    workers = set(sampler.worker_pids)
    backends = set(sampler.first) - workers
    jobs = len(stamps)
    active = sum(sampler.waits.values()) or 1
    claims = sampler.kinds["claim"] or 1
    return {
        "processes": processes, "rate": (jobs - 1) / (stamps[-1] - stamps[0]),
        "worker_cpu": sampler.cpu_ms(workers) / jobs, "backend_cpu": sampler.cpu_ms(backends) / jobs,
        "backends": len(backends), "samples": sampler.samples,
        "waits": [(event, n / active) for event, n in sampler.waits.most_common(6)],
        "lock_waits": [(what, n / active) for what, n in sampler.lock_waits.most_common(4)],
        "claim_lock_share": sum(n for what, n in sampler.lock_waits.items()
                                if what.startswith("claim ")) / claims,
        "any_lock_share": sum(sampler.lock_waits.values()) / active,
        "page_share": sampler.waits["LWLock:BufferContent"] / active,
        "counter_share": sampler.kinds["throughput counter"] / active,
        "counter_lock_share": sum(n for what, n in sampler.lock_waits.items()
                                  if what.startswith("throughput counter ")) / active,
    }


# Part 5: held-back keyed jobs --------------------------------------------------------


def load_keyed(case: dict, plain: int, keys: int) -> float:
    """Load one case of part 5 (bench/keys.py's loaders), VACUUM ANALYZE, CHECKPOINT;
    return seconds taken."""
    started = time.perf_counter()
    with connect(case["db"]) as conn:
        case["parked"] = key_bench.load_held(conn, case["held"], keys) if case["held"] else 0
        if case["offered"]:
            key_bench.load_offered(conn, plain)
        else:
            key_bench.load_plain(conn, plain)
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    return time.perf_counter() - started


def measure_keyed(cfg, cases: list[dict]) -> None:
    """The cases loaded, then plans and interleaved per-claim costs."""
    for case in cases:
        case["load_s"] = load_keyed(case, cfg.claims + 100, cfg.key_count)
        print(f"scale: {case['label']} loaded in {case['load_s']:.1f} s", flush=True)
    plans = {c["db"]: claim_plan(c["db"]) for c in cases}
    costs = claim_costs([c["db"] for c in cases], cfg.claims)
    for case in cases:
        plan, summary = plans[case["db"]]
        case.update(plan=plan, summary=summary, cost=costs[case["db"]])
        with connect(case["db"]) as conn:
            left = conn.execute("SELECT count(*) FROM soniq_key_parked").fetchone()[0]
        if left != case["parked"]:
            raise RuntimeError(f"{case['label']}: {left} keyed jobs held back, not "
                               f"{case['parked']}: a claim took a held-back job")
        print(f"scale:   {case['label']:<44} claim {case['cost']['median']:.3f} ms (server "
              f"{case['cost']['server']:.3f}), plan {summary['index']} hit={summary['hit']} "
              f"read={summary['read']}", flush=True)


def render_keyed(cfg, cases: list[dict]) -> list[str]:
    alone, beside, offered = cases
    out = [f"HELD-BACK KEYED JOBS (issue 31: {cfg.claims + 100:,} plain jobs alone, and beside "
           f"{beside['parked']:,} keyed jobs held back over {cfg.key_count:,} keys at a limit "
           "of 1, each key's one job running; and keyed jobs, each key offering one; "
           "claim = soniq_claim() alone, one connection, synchronous_commit off)"]
    out.append(f"  {'case':<46} {'claim ms':>9} {'p90':>7} {'server ms':>9}  "
               "plan: index, buffers hit/read, ms; loaded in")
    for case in cases:
        c, s = case["cost"], case["summary"]
        out.append(f"  {case['label']:<46} {c['median']:>9.3f} {c['p90']:>7.3f} "
                   f"{c['server']:>9.3f}  {s['index']}, {s['hit']}/{s['read']}, "
                   f"{s['ms']:.3f}; {case['load_s']:.0f} s")
    ratio = beside["cost"]["server"] / alone["cost"]["server"]
    client = beside["cost"]["median"] / alone["cost"]["median"]
    out.append(f"  per-claim cost beside {beside['parked']:,} held-back keyed jobs ÷ none "
               f"(server time; client-timed median in brackets): {ratio:.2f}× ({client:.2f}×)  "
               f"target ≤1.20×: {_verdict(ratio, 1.2)}")
    keyed = offered["cost"]["server"] / alone["cost"]["server"]
    out.append(f"  a keyed job's claim ÷ a plain job's (its key's trigger, for information): "
               f"{keyed:.2f}× ({offered['cost']['median'] / alone['cost']['median']:.2f}×)")
    out.append("")
    out.append(f"CLAIM PLAN BESIDE {beside['parked']:,} HELD-BACK KEYED JOBS (auto_explain inside "
               "soniq_claim, after 8 calls)")
    out.extend("  " + line for line in beside["plan"].splitlines())
    return out


# Output -------------------------------------------------------------------------


def _verdict(value: float, goal: float) -> str:
    return "met" if value <= goal else "MISSED"


def render_depths(cfg, base: dict, depths: list[dict]) -> list[str]:
    out = ["COST VS. QUEUE DEPTH (claim = soniq_claim() alone, one connection, "
           "synchronous_commit off; throughput = claim+complete, "
           f"{cfg.connections} connections, {cfg.throughput_jobs:,} jobs)",
           f"  each depth but the first ('alone') also holds {cfg.future:,} jobs scheduled a day "
           f"ahead and {cfg.done:,} finished, unexpired rows, mixed in; 'after drain' = "
           f"{cfg.head:,} more jobs queued ahead and drained, no vacuum; 'claim ms' client-timed "
           "median, 'server ms' mean time inside soniq_claim_many (pg_stat_user_functions)"]
    out.append(f"  {'queued':>10} {'phase':<12} {'claim ms':>9} {'p90':>7} {'server ms':>9} "
               f"{'jobs/s':>8}  plan: index, rows filtered out, buffers hit/read, ms")
    for found in [base, *depths]:
        for phase, label in (("fresh", "fresh"), ("drained", "after drain")):
            if phase not in found:
                continue
            m = found[phase]
            if not found["mixed"]:
                label = "alone"
            s, c = m["summary"], m["cost"]
            out.append(f"  {found['depth']:>10,} {label:<12} {c['median']:>9.3f} {c['p90']:>7.3f} "
                       f"{c['server']:>9.3f} {m['rate']:>8,.0f}  {s['index']}, {s['removed']:,}, "
                       f"{s['hit']}/{s['read']}, {s['ms']:.3f}")
    first, last = depths[0], depths[-1]
    out.append("  verdicts on the server's time per claim (client-timed median in brackets: it "
               "carries the machine's scheduling noise)")
    for phase, label in (("fresh", "fresh"), ("drained", "after drain")):
        ratio = last[phase]["cost"]["server"] / first[phase]["cost"]["server"]
        client = last[phase]["cost"]["median"] / first[phase]["cost"]["median"]
        out.append(f"  per-claim cost {last['depth']:,} ÷ {first['depth']:,}, {label}: "
                   f"{ratio:.2f}× ({client:.2f}×)  target ≤1.50×: {_verdict(ratio, 1.5)}")
    alone = base["fresh"]["cost"]
    for found in depths:
        ratio = found["fresh"]["cost"]["server"] / alone["server"]
        client = found["fresh"]["cost"]["median"] / alone["median"]
        out.append(f"  per-claim cost {found['depth']:,} mixed, fresh ÷ {base['depth']:,} alone: "
                   f"{ratio:.2f}× ({client:.2f}×)  target ≤1.50×: {_verdict(ratio, 1.5)}")
    for found in depths:
        ratio = found["drained"]["cost"]["server"] / found["fresh"]["cost"]["server"]
        client = found["drained"]["cost"]["median"] / found["fresh"]["cost"]["median"]
        out.append(f"  at {found['depth']:,}: after drain ÷ fresh {ratio:.2f}× ({client:.2f}×) "
                   f"({found['dead']:,} dead tuples; head drained in {found['head_s']:.1f} s); "
                   f"loaded in {found['load_s']:.1f} s")
    out.append("")
    out.append(f"CLAIM PLAN AT {last['depth']:,} (auto_explain inside soniq_claim, after 8 calls)")
    for phase in ("fresh", "drained"):
        out.append(f"  {phase}:")
        out.extend("    " + line for line in last[phase]["plan"].splitlines())
    return out


def render_workers(cfg, workers: list[dict]) -> list[str]:
    out = [f"COST VS. WORKER PROCESSES (soniq_worker --burst --concurrency "
               f"{cfg.worker_concurrency}, {cfg.worker_jobs:,} jobs, {os.cpu_count()} CPUs; "
               "pg_stat_activity every 20 ms)"]
    out.append(f"  {'procs':>5} {'jobs/s':>8} {'worker CPU':>11} {'backend CPU':>12} "
               f"{'total':>7}  ms/job  {'lock waits':>10} {'claims on a lock':>17}")
    base = workers[0]["worker_cpu"] + workers[0]["backend_cpu"]
    for w in workers:
        total = w["worker_cpu"] + w["backend_cpu"]
        out.append(f"  {w['processes']:>5} {w['rate']:>8,.0f} {w['worker_cpu']:>11.3f} "
                   f"{w['backend_cpu']:>12.3f} {total:>7.3f}  ({total / base:.2f}×) "
                   f"{w['any_lock_share'] * 100:>8.1f} % {w['claim_lock_share'] * 100:>15.1f} %")
    for w in workers:
        waits = ", ".join(f"{event} {share * 100:.0f}%" for event, share in w["waits"])
        locks = ", ".join(f"{what} {share * 100:.1f}%" for what, share in w["lock_waits"]) or "none"
        out.append(f"  {w['processes']} procs, active backends: {waits}")
        out.append(f"    heavyweight lock waits: {locks} ({w['samples']} samples, "
                   f"{w['backends']} backends)")
    worst = max(w["claim_lock_share"] for w in workers)
    out.append(f"  claims waiting on a heavyweight lock (tuple, transactionid, relation), worst "
               f"over P: {worst * 100:.1f} % of claim samples  target ≤5 %: "
               f"{_verdict(worst, 0.05)}")
    page = max(w["page_share"] for w in workers)
    out.append(f"  waits on a page's content lock (LWLock:BufferContent), worst over P: "
               f"{page * 100:.1f} % of active samples  target ≤5 %: {_verdict(page, 0.05)}")
    counter = max(w["counter_share"] for w in workers)
    counter_lock = max(w["counter_lock_share"] for w in workers)
    out.append(f"  the throughput counter's upsert (one row per minute and queue), worst over P: "
               f"running in {counter * 100:.1f} %, waiting on a lock in {counter_lock * 100:.1f} % "
               f"of active samples  target ≤5 %: {_verdict(counter_lock, 0.05)}")
    out.append("  the reaper runs inside each claim (its probe finds no lapsed lease in a drain): "
               "its time and waits are the claims'")
    last_w = workers[-1]
    growth = (last_w["worker_cpu"] + last_w["backend_cpu"]) / base
    out.append(f"  CPU per job at {last_w['processes']} procs ÷ 1 proc: {growth:.2f}×  "
               f"target ≤1.50×: {_verdict(growth, 1.5)}")
    return out


def header() -> str:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except Exception:
            return "?"

    with connect("postgres") as conn:
        show = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in
                ("server_version", "synchronous_commit", "fsync", "autovacuum", "shared_buffers")}
    dirty = " + uncommitted changes" if git("status", "--porcelain", "soniq_django") else ""
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"soniq_django scale benchmark — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"soniq_django from the working tree (HEAD {git('rev-parse', '--short', 'HEAD')}"
            f"{dirty})\nPostgreSQL {show['server_version']} (synchronous_commit="
            f"{show['synchronous_commit']}, fsync={show['fsync']}, autovacuum={show['autovacuum']}, "
            f"shared_buffers={show['shared_buffers']}), {os.cpu_count()} CPUs, load average {load} "
            "at the end")


# Main ---------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="depths 10k and 100k, 20k scheduled/finished rows, fewer calls, "
                             "P up to 4 (make bench-scale-quick, ~3 min)")
    parser.add_argument("--depths", help="comma-separated queue depths (default 10000,100000,"
                                         "1000000)")
    parser.add_argument("--processes", help="comma-separated worker process counts (default "
                                            "1,2,4,8)")
    parser.add_argument("--claims", type=int, help="timed claims per depth and phase "
                                                   "(default 1000; quick 300)")
    parser.add_argument("--throughput-jobs", type=int, help="jobs per throughput run (default "
                                                            "3000; quick 1000)")
    parser.add_argument("--no-workers", action="store_true", help="no part 3")
    parser.add_argument("--no-depth", action="store_true", help="no part 1")
    parser.add_argument("--finished", type=int, default=0,
                        help="part 2 with this many finished rows (make bench-finished: "
                             "10000000; default 0: no part 2)")
    parser.add_argument("--waiting", type=int,
                        help="part 4 with this many waiting dependents (default 100000; "
                             "quick 20000; 0: no part 4)")
    parser.add_argument("--keyed", type=int,
                        help="part 5 with this many held-back keyed jobs over 1,000 keys "
                             "(default 100000; quick 20000; 0: no part 5)")
    cfg = parser.parse_args(argv)
    quick = cfg.quick
    default_depths = "10000,100000" if quick else "10000,100000,1000000"
    cfg.depths = [int(d) for d in (cfg.depths or default_depths).split(",")]
    cfg.processes = [int(p) for p in (cfg.processes or ("1,2,4" if quick else "1,2,4,8"))
                     .split(",")]
    cfg.future = 20_000 if quick else 100_000
    cfg.done = 20_000 if quick else 100_000
    cfg.head = 10_000 if quick else 50_000
    cfg.claims = cfg.claims or (300 if quick else 1000)
    cfg.connections = 4
    cfg.throughput_jobs = cfg.throughput_jobs or (1000 if quick else 3000)
    cfg.worker_jobs = 2000 if quick else 10_000
    cfg.worker_concurrency = 2
    cfg.finished_queued = 100_000
    cfg.waiting = (20_000 if quick else 100_000) if cfg.waiting is None else cfg.waiting
    cfg.waiting_queued = 10_000
    cfg.keyed = (20_000 if quick else 100_000) if cfg.keyed is None else cfg.keyed
    cfg.key_count = 1000
    if min(cfg.depths) <= cfg.claims + cfg.throughput_jobs:
        parser.error(f"every depth must exceed {cfg.claims + cfg.throughput_jobs} jobs")
    return cfg


def main(argv=None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _on_signal)
    pid = os.getpid()
    log_dir = Path(tempfile.mkdtemp(prefix=f"soniq-scale-{pid}-"))
    db = f"soniq_bench_{pid}_scale"
    system = System("soniq", PROJECT_PY, "bench.soniq_tasks", "bench.soniq_settings",
                    QUEUED_SQL, "SELECT count(*) FROM soniq_jobs WHERE status = 'done'",
                    RESET_SQL, db=db, log_dir=log_dir)
    ok = False
    created = False
    copies: list[str] = []
    try:
        print(f"scale: database {db}, logs in {log_dir}", flush=True)
        create_database(db)
        created = True
        system.action("migrate")
        started = time.perf_counter()
        base: dict = {}
        depths: list[dict] = []
        if not cfg.no_depth:
            # One database per depth, copies of the migrated one, so that the per-claim
            # timings of all depths can take turns.
            base = {"depth": min(cfg.depths), "mixed": False}
            depths = [{"depth": d, "mixed": True} for d in cfg.depths]
            for index, case in enumerate([base, *depths]):
                case["db"] = f"{db}_{index}"
                case["label"] = f"{case['depth']:,}" + ("" if case["mixed"] else " alone")
                create_database(case["db"], template=db)
                copies.append(case["db"])
            measure_depths(cfg, [base, *depths])
        finished: list[dict] = []
        if cfg.finished:
            finished = [{"finished": 0, "label": f"{cfg.finished_queued:,} queued alone"},
                        {"finished": cfg.finished,
                         "label": f"beside {cfg.finished:,} finished"}]
            for index, case in enumerate(finished):
                case["db"] = f"{db}_f{index}"
                create_database(case["db"], template=db)
                copies.append(case["db"])
            measure_finished(cfg, finished)
        waiting: list[dict] = []
        if cfg.waiting:
            waiting = [{"waiting": 0, "label": f"{cfg.waiting_queued:,} queued alone"},
                       {"waiting": cfg.waiting,
                        "label": f"beside {cfg.waiting:,} waiting dependents"}]
            for index, case in enumerate(waiting):
                case["db"] = f"{db}_w{index}"
                create_database(case["db"], template=db)
                copies.append(case["db"])
            measure_waiting(cfg, waiting)
        keyed: list[dict] = []
        if cfg.keyed:
            keyed = [{"held": 0, "offered": False, "label": "plain jobs alone"},
                     {"held": cfg.keyed, "offered": False,
                      "label": f"plain beside {cfg.keyed:,} held-back keyed jobs"},
                     {"held": 0, "offered": True, "label": "keyed jobs, each key offering one"}]
            for index, case in enumerate(keyed):
                case["db"] = f"{db}_k{index}"
                create_database(case["db"], template=db)
                copies.append(case["db"])
            measure_keyed(cfg, keyed)
        workers = []
        if not cfg.no_workers:
            for processes in cfg.processes:
                found = measure_workers(cfg, system, processes)
                print(f"scale: {processes} worker processes: {found['rate']:,.0f} jobs/s, "
                      f"{found['worker_cpu'] + found['backend_cpu']:.3f} ms CPU/job", flush=True)
                workers.append(found)
        elapsed = time.perf_counter() - started
        print(f"scale: measured in {elapsed:.0f} s\n", flush=True)
        lines = [header()]
        if depths:
            lines += ["", *render_depths(cfg, base, depths)]
        if finished:
            lines += ["", *render_finished(cfg, finished)]
        if waiting:
            lines += ["", *render_waiting(cfg, waiting)]
        if keyed:
            lines += ["", *render_keyed(cfg, keyed)]
        if workers:
            lines += ["", *render_workers(cfg, workers)]
        print("\n".join(lines))
        ok = True
        return 0
    except KeyboardInterrupt:
        print("scale: interrupted", file=sys.stderr)
        return 130
    finally:
        _stop_children()
        for name in [*copies, *([db] if created else [])]:
            try:
                drop_database(name)
            except Exception as error:
                print(f"scale: could not drop {name}: {error}", file=sys.stderr)
        if ok:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            print(f"scale: worker logs kept in {log_dir}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
