"""The raw-SQL ceiling, and soniq's claim protocol driven without the worker.

Runs inside the orchestrator (project .venv) with psycopg: one connection per
thread, autocommit (one transaction per statement), prepared statements.

The ceiling table is ``raw_jobs``: ``CREATE TABLE raw_jobs (LIKE soniq_jobs
INCLUDING ALL)`` in a database migrated like soniq's, so it has soniq_jobs'
columns, defaults, CHECKs and every index (the partial claim indexes
included), but no trigger and no functions in the path.
"""

import json
import secrets
import statistics
import threading
import time
import uuid

from bench.common import connect

RAW_TABLE_DDL = "CREATE TABLE raw_jobs (LIKE soniq_jobs INCLUDING ALL)"

RAW_INSERT = (
    "INSERT INTO raw_jobs (id, job_name, args) VALUES (gen_random_uuid(), %s, %s::jsonb)"
)
RAW_CLAIM = (
    "UPDATE raw_jobs SET status = 'processing', attempts = attempts + 1, updated_at = now() "
    "WHERE id = (SELECT id FROM raw_jobs WHERE status = 'queued' "
    "ORDER BY priority, created_at LIMIT 1 FOR UPDATE SKIP LOCKED) "
    "RETURNING id, job_name, args"
)
RAW_COMPLETE = "UPDATE raw_jobs SET status = 'done', updated_at = now() WHERE id = %s"
#: The batched ceiling: one statement, so one round trip and one commit, completes the
#: last batch this connection claimed and claims the next RAW_BATCH jobs.
RAW_BATCH = 10
#: The completion runs first: the claim's subquery reads the data-modifying CTE (a
#: one-time InitPlan), so the CTE runs to the end before the claim locks anything. Left
#: unreferenced, the CTE ran after the claim, and two connections deadlocked: a claim's
#: FOR UPDATE SKIP LOCKED can lock a row another connection claimed a moment before (its
#: snapshot still saw it queued; the recheck drops the row but keeps the lock), and the
#: completion then waited on that lock while the other one waited on the claimer's.
#: Completing first, a connection waits only while it holds its own claimed rows, and
#: every lock it can wait on is held by a claim, which never waits (SKIP LOCKED).
RAW_COMPLETE_AND_CLAIM = (
    "WITH done AS (UPDATE raw_jobs SET status = 'done', updated_at = now() "
    "WHERE id = ANY(%s::uuid[]) RETURNING id) "
    "UPDATE raw_jobs SET status = 'processing', attempts = attempts + 1, updated_at = now() "
    "WHERE id IN (SELECT id FROM raw_jobs WHERE status = 'queued' "
    "AND (SELECT count(*) FROM done) >= 0 "
    "ORDER BY priority, created_at LIMIT %s FOR UPDATE SKIP LOCKED) "
    "RETURNING id, job_name, args"
)

SONIQ_ENQUEUE = "SELECT soniq_enqueue(%s, %s::jsonb)"
SONIQ_CLAIM = "SELECT job_id, queue, generation FROM soniq_claim(%s, %s)"
SONIQ_COMPLETE = "SELECT soniq_complete(%s, %s, %s, %s, %s, NULL, 300)"


def create_raw_table(dbname: str) -> None:
    with connect(dbname) as conn:
        conn.execute(RAW_TABLE_DDL)


def reset_raw(dbname: str) -> None:
    with connect(dbname) as conn:
        conn.execute("TRUNCATE raw_jobs")


def copy_rows(dbname: str, count: int) -> float:
    """COPY ``count`` queued rows into raw_jobs in one transaction; return rows/s."""
    with connect(dbname) as conn:
        started = time.perf_counter()
        with conn.transaction(), conn.cursor() as cur:
            with cur.copy("COPY raw_jobs (id, job_name, args) FROM STDIN") as copy:
                for i in range(count):
                    copy.write_row((uuid.uuid4(), "bench.noop", json.dumps({"i": i})))
        return count / (time.perf_counter() - started)


def insert_loop(dbname: str, count: int, sql: str = RAW_INSERT) -> float:
    """``count`` single-row inserts, one transaction each; return rows/s."""
    with connect(dbname) as conn:
        conn.execute(sql, ["bench.noop", '{"i": -1}'], prepare=True)  # prepare, warm up
        started = time.perf_counter()
        for i in range(count):
            conn.execute(sql, ["bench.noop", '{"i": %d}' % i], prepare=True)
        return count / (time.perf_counter() - started)


def insert_threads(dbname: str, connections: int, count: int, sql: str = RAW_INSERT) -> float:
    """``count`` single-row inserts spread over ``connections`` threads; rows/s."""
    conns = [connect(dbname) for _ in range(connections)]
    for conn in conns:
        conn.execute(sql, ["bench.noop", '{"i": -1}'], prepare=True)
    gate = threading.Barrier(connections + 1)
    share = count // connections

    def run(conn) -> None:
        gate.wait()
        for i in range(share):
            conn.execute(sql, ["bench.noop", '{"i": %d}' % i], prepare=True)

    threads = [threading.Thread(target=run, args=(conn,)) for conn in conns]
    for thread in threads:
        thread.start()
    gate.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    for conn in conns:
        conn.close()
    return share * connections / elapsed


def _drain_threads(dbname: str, connections: int, window: float | None, one_job) -> dict:
    """Run ``one_job(conn)`` on ``connections`` threads until the queue is empty or
    ``window`` seconds pass; return jobs/s from the first claim to the last completion.

    ``one_job`` returns how many jobs it completed (True: one), or None (or False) when
    the queue has nothing left for it, which ends that thread."""
    conns = [connect(dbname) for _ in range(connections)]
    stop = threading.Event()
    start_gate = threading.Barrier(connections + 1)
    done = [0] * connections
    last = [0.0] * connections
    errors: list[BaseException] = []

    def run(index: int) -> None:
        conn = conns[index]
        try:
            start_gate.wait()
            while not stop.is_set():
                finished = one_job(conn)
                if finished is None or finished is False:
                    return
                if finished:
                    done[index] += int(finished)
                    last[index] = time.perf_counter()
        except BaseException as error:  # reported by the caller
            errors.append(error)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(connections)]
    for thread in threads:
        thread.start()
    start_gate.wait()
    started = time.perf_counter()
    if window:
        deadline = started + window
        while any(t.is_alive() for t in threads) and time.perf_counter() < deadline:
            time.sleep(0.05)
        stop.set()
    for thread in threads:
        thread.join()
    for conn in conns:
        conn.close()
    if errors:
        raise errors[0]
    total = sum(done)
    return {"rate": total / (max(last) - started), "jobs": total}


def raw_drain(dbname: str, connections: int, window: float | None) -> dict:
    def one_job(conn) -> bool:
        row = conn.execute(RAW_CLAIM, prepare=True).fetchone()
        if row is None:
            return False
        conn.execute(RAW_COMPLETE, [row[0]], prepare=True)
        return True

    return _drain_threads(dbname, connections, window, one_job)


def raw_batch_drain(dbname: str, connections: int, window: float | None,
                    batch: int = RAW_BATCH) -> dict:
    """The batched ceiling: each connection completes its last ``batch`` jobs and claims the
    next ``batch`` (FOR UPDATE SKIP LOCKED) in one statement -- one commit per ``batch`` jobs.

    A job counts once the statement that completed it committed (the data-modifying CTE
    runs whether or not the claim found rows). A window that ends leaves the last claims
    of each connection unfinished, as a stopped worker would.
    """
    held: dict[int, list] = {}

    def one_batch(conn) -> int | None:
        previous = held.get(id(conn), [])
        rows = conn.execute(RAW_COMPLETE_AND_CLAIM, [previous, batch], prepare=True).fetchall()
        held[id(conn)] = [row[0] for row in rows]
        if not rows and not previous:
            return None  # the queue is empty and nothing is held: this connection is done
        return len(previous)

    return _drain_threads(dbname, connections, window, one_batch)


def protocol_drain(dbname: str, connections: int, window: float | None) -> dict:
    """soniq_claim + soniq_complete per job, straight from psycopg: the fenced SQL
    protocol's own cost, without the Python worker around it."""
    owner = str(uuid.uuid4())

    def one_job(conn) -> bool:
        token = secrets.token_hex(16)
        row = conn.execute(SONIQ_CLAIM, [owner, token], prepare=True).fetchone()
        if row is None:
            return False
        job_id, queue, generation = row
        (ok,) = conn.execute(
            SONIQ_COMPLETE, [str(job_id), owner, generation, token, queue], prepare=True
        ).fetchone()
        assert ok, "soniq_complete refused a live claim"
        return True

    return _drain_threads(dbname, connections, window, one_job)


#: The queues of claim_costs(): none, a concurrency limit, a rate limit -- each far
#: above what the loop reaches, so they never bind and the row is their cost alone.
CLAIM_COST_QUEUES = {
    "none": None, "limited": (100_000, None, None), "rated": (None, 1_000_000, 1),
}


def claim_costs(dbname: str, count: int, chunk: int = 20) -> dict[str, float]:
    """Median ms of one soniq_claim() per kind of queue (CLAIM_COST_QUEUES), synchronous_commit off.

    What the claim itself costs, not the WAL flush of its commit. Each kind
    is its own queue in one database, claimed by name; the kinds take turns
    in chunks of ``chunk`` calls so that all of them see the same machine.
    Each claimed job is completed before the next claim, outside the timing,
    so a queue's running count stays as small as a worker's would keep it.
    The rate-limited queue's window then holds the starts of the last second.
    """
    owner = str(uuid.uuid4())
    with connect(dbname) as conn:
        for queue, limits in CLAIM_COST_QUEUES.items():
            conn.execute("INSERT INTO soniq_jobs (id, job_name, args, queue, created_at) "
                         "SELECT gen_random_uuid(), 'bench.noop', '{}', %s, "
                         "now() + g * interval '1 microsecond' FROM generate_series(0, %s) g",
                         [queue, count])
            if limits is not None:
                conn.execute("INSERT INTO soniq_queue_settings (queue, concurrency, rate_limit, "
                             "rate_period) VALUES (%s, %s, %s, %s)", [queue, *limits])
        conn.execute("VACUUM ANALYZE soniq_jobs")
    samples: dict[str, list[float]] = {queue: [] for queue in CLAIM_COST_QUEUES}
    sql = "SELECT job_id, queue, generation FROM soniq_claim(%s, %s, ARRAY[%s])"
    with connect(dbname) as conn:
        conn.execute("SET synchronous_commit = off")
        done = -1  # the first round warms up (prepares), untimed
        while done < count:
            for queue, found in samples.items():
                for _ in range(chunk if done >= 0 else 1):
                    token = secrets.token_hex(16)
                    started = time.perf_counter()
                    row = conn.execute(sql, [owner, token, queue], prepare=True).fetchone()
                    spent = time.perf_counter() - started
                    assert row is not None, f"queue {queue} ran dry"
                    if done >= 0:
                        found.append(spent)
                    job_id, _, generation = row
                    conn.execute(SONIQ_COMPLETE, [str(job_id), owner, generation, token, queue],
                                 prepare=True)
            done += chunk if done >= 0 else 1
    return {queue: statistics.median(found) * 1000 for queue, found in samples.items()}
