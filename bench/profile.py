"""Where a soniq_worker drain spends its time: ``python -m bench.run --profile CONCURRENCY``.

Two instruments, both against a database of this run:

1. Per-call cost, one psycopg connection, prepared statements: each SQL call
   a job makes (and the raw ceiling's equivalents), timed with
   synchronous_commit on (the default: every commit waits for its WAL
   flush) and off (what the statement itself costs), plus what opening a
   connection costs. Django's own cost per call comes from the same calls
   made through OwnedJobSource in a child process.
2. py-spy (from bench/.venv-peers) samples a ``soniq_worker --burst`` drain
   with --idle, so time spent waiting on the database is counted; samples
   are grouped per thread kind and per frame (inclusive).
"""

import collections
import re
import secrets
import statistics
import time
import uuid
from pathlib import Path

from bench import raw
from bench.common import connect, quiesce

CALLS = 500


def _timed(conn, sql, params_for, count=CALLS) -> float:
    """Mean ms of ``count`` executions, each with its own params."""
    samples = []
    for i in range(count):
        params = params_for(i)
        started = time.perf_counter()
        cur = conn.execute(sql, params, prepare=True)
        if cur.description is not None:
            cur.fetchall()
        samples.append(time.perf_counter() - started)
    return statistics.mean(samples) * 1000


def call_costs(soniq, count=CALLS) -> list[tuple[str, float, float]]:
    rows = []
    db = soniq.db
    with connect(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS raw_jobs (LIKE soniq_jobs INCLUDING ALL)")
    for sync in ("on", "off"):
        soniq.reset()
        with connect(db) as conn:
            conn.execute("TRUNCATE raw_jobs")
        quiesce(db)
        with connect(db) as conn:
            conn.execute(f"SET synchronous_commit = {sync}")
            found = {}
            found["raw INSERT"] = _timed(conn, raw.RAW_INSERT,
                                         lambda i: ["bench.noop", '{"i": %d}' % i], count)
            found["SELECT soniq_enqueue()"] = _timed(
                conn, raw.SONIQ_ENQUEUE, lambda i: ["bench.noop", '{"i": %d}' % i], count)
            ids = []
            started = time.perf_counter()
            for _ in range(count):
                ids.append(conn.execute(raw.RAW_CLAIM, prepare=True).fetchone()[0])
            found["raw claim (UPDATE … SKIP LOCKED)"] = (time.perf_counter() - started) / count * 1000
            found["raw complete (UPDATE by id)"] = _timed(conn, raw.RAW_COMPLETE,
                                                          lambda i: [ids[i]], count)
            owner = str(uuid.uuid4())
            fences = []
            started = time.perf_counter()
            for _ in range(count):
                token = secrets.token_hex(16)
                job_id, queue, generation = conn.execute(
                    raw.SONIQ_CLAIM, [owner, token], prepare=True).fetchone()
                fences.append([str(job_id), owner, generation, token, queue])
            found["soniq_claim()"] = (time.perf_counter() - started) / count * 1000
            found["soniq_set_pid()"] = _timed(
                conn, "SELECT soniq_set_pid(%s, %s, %s, %s, %s, 4242)", lambda i: fences[i], count)
            found["soniq_heartbeat()"] = _timed(
                conn, "SELECT soniq_heartbeat(%s, %s, %s, %s, %s, 30)", lambda i: fences[i], count)
            found["soniq_complete()"] = _timed(conn, raw.SONIQ_COMPLETE, lambda i: fences[i], count)
            found["SELECT 1 (round trip, no commit)"] = _timed(conn, "SELECT 1", lambda i: [],
                                                              count)
        rows.append((sync, found))
    started = time.perf_counter()
    for _ in range(50):
        connect(db).close()
    connect_ms = (time.perf_counter() - started) / 50 * 1000
    on, off = rows[0][1], rows[1][1]
    table = [(name, on[name], off[name]) for name in on]
    table.append(("open + close a psycopg connection", connect_ms, connect_ms))
    return table


def _group(thread: str) -> str:
    name = thread.split(":", 1)[1].strip() if ":" in thread else thread
    return re.sub(r"_\d+$", "", name)


def hotspots(path: Path, top: int = 22) -> str:
    """Inclusive share of samples per frame, per thread kind, from py-spy's raw output."""
    per_group: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    totals: collections.Counter = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        group = _group(frames[0])
        n = int(count)
        totals[group] += n
        seen = set()
        for frame in frames[1:]:
            name = re.sub(r":\d+\)$", ")", frame)  # merge lines of one function
            if name not in seen:
                seen.add(name)
                per_group[group][name] += n
    out = []
    for group, total in totals.most_common():
        if group in ("soniq-listener",) or total == 0:
            continue
        out.append(f"[{group}] {total} samples (with idle time)")
        shown = 0
        for name, n in per_group[group].most_common():
            interesting = any(s in name for s in (
                "soniq_django", "django/db", "psycopg", "threading.py", "queue.py",
                "concurrent/futures"))
            if not interesting or n == total:
                continue
            out.append(f"  {n / total * 100:5.1f}%  {name}")
            shown += 1
            if shown >= top:
                break
    return "\n".join(out)


def profile_drain(cfg, soniq, concurrency: int, log_dir: Path) -> None:
    from bench.run import drain

    print("\nPer-call cost, one psycopg connection, prepared (ms per call):")
    print(f"  {'call':<40} {'sync commit on':>15} {'off':>8}")
    for name, on, off in call_costs(soniq):
        print(f"  {name:<40} {on:>15.2f} {off:>8.2f}")
    django = soniq.action("callcost", CALLS)
    print("\nThe same through Django (OwnedJobSource / enqueue, CONN_MAX_AGE as configured):")
    for name, value in django.items():
        print(f"  {name:<56} {value:>8.2f} ms")

    out = log_dir / "py-spy.txt"
    # A whole (burst) drain: py-spy writes its file when the worker exits by itself.
    found = drain(soniq, cfg, concurrency, 1, jobs=cfg.profile_jobs, window=0, profile=out)
    print(f"\nsoniq_worker --burst --concurrency {concurrency}: {found['rate']:.1f} jobs/s "
          f"over {found['jobs']} jobs; py-spy samples by thread kind (inclusive):")
    print(hotspots(out))
