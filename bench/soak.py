"""Hours of load: enqueue and drain at a steady rate for a long time, one row a minute.

    python -m bench.soak [--minutes 30] [--rate R] [--workers P --concurrency C]
    make soak SOAK_ARGS="--minutes 60"      make soak-quick   (3 minutes)

The run owns its PostgreSQL: a throwaway cluster (initdb/pg_ctl under /tmp on
a free port, tests/chaos/cluster.py) with the server's *stock* settings --
autovacuum on, fsync on, shared_buffers 128MB -- except that autovacuum runs
and checkpoints are logged. So the figures are those of a default server, whatever the
machine's shared one is set to (here autovacuum is off globally).

1. **Maximum.** Unless ``--rate`` is given, P worker processes
   (``soniq_worker --concurrency C``) drain while a producer enqueues as fast
   as it can, for ``--measure-seconds``; the maximum is the rate at which
   handlers started over the second half of that window (the pipeline's
   capacity: the producer and the workers share the CPUs, as in the soak).
   Then the workers stop and the table is truncated and vacuumed.
2. **Soak.** Fresh workers; one producer process enqueues
   ``SELECT soniq_enqueue('bench.soak', '{"t": <time>}')`` (one job per
   transaction, prepared) at half the maximum, paced against the clock. The
   workers run with every SONIQ default except ``RESULT_TTL`` (``--result-ttl``,
   120 s), so their once-a-minute purge runs many cycles (bench/soak_settings.py).
3. **Every minute** a row: jobs enqueued and started per second, queued
   backlog, start latency p50/p99 (handler start - the producer's clock just
   before its enqueue call), worker and server CPU per job (/proc: the worker
   processes; the postmaster with its children, live and reaped),
   ``soniq_jobs`` heap, index and total size, live and dead tuples, rows
   deleted, the HOT share of updates, autovacuum/autoanalyze runs, the WAL
   written (MB, full-page images), checkpoints started and the share of
   buffer reads found in shared_buffers. Every soniq table and index gets
   its size (and a table its live and dead tuples) each minute in a second
   CSV, ``<name>-relations.csv``.
4. **Verdicts** at the end (see ``verdicts``), the table as text and CSV under
   bench/results/ (or ``--out``), the biggest soniq relations at the
   reference minute (the last before the pin, else the first), at their peak
   and at the end (``relations_report``), and a plot (matplotlib, from
   bench/.venv-plot, which bench/plot-venv.sh makes; never a project
   dependency).

**A pinned horizon** (``--pin-minutes P``, ``make bench-pin``; issue 27):
after ``--pin-start`` minutes of the soak, a session opens a ``REPEATABLE
READ`` transaction, reads ``soniq_jobs`` once (its snapshot is taken then)
and holds it open for P minutes, as an analytics query, a ``pg_dump`` or an
idle-in-transaction session would: vacuum removes nothing newer than that
snapshot meanwhile. The soak goes on ``--pin-after`` minutes after the
release. With ``--pin-via standby`` (``make bench-pin-standby``) the
transaction runs on a streaming standby with ``hot_standby_feedback = on``
instead (bench/pinning.py). Either way each row carries the age of the
primary's oldest xmin (``hznK``, thousands of transactions) and the
verdicts check that it was held. A claim probe times ``soniq_claim_many``
every ``PROBE_SECONDS`` on a session of its own (the call the workers
make, claiming one job of every queue; it completes what it claims); each
minute's row gets the probe's claim time p50/p99, the verdicts compare the
pin with the minutes before it (``pin_verdicts``), and every probe's start
time and duration go to ``claims.csv`` in the log directory.

Only the standard library at import time: ``--plot-only`` runs in the plot venv.
"""

import argparse
import csv
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.pinning import ClaimProbe, Pin, horizon, standby_of, wait_for_horizon

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PY = ROOT / ".venv" / "bin" / "python"
PLOT_PY = ROOT / "bench" / ".venv-plot" / "bin" / "python"
DB = "soniq_soak"
JOB = "bench.soak"
ENQUEUE = "SELECT soniq_enqueue(%s, %s::jsonb)"
TICK = os.sysconf("SC_CLK_TCK")

#: Verdict thresholds (docs/performance.md#hours-of-load).
FLAT = 1.2  # last window / first window, latency and CPU per job
BOUNDED = 1.1  # size at the end / size right after the first purge cycle
WINDOW = 5  # minutes
#: Pinned-horizon targets (issue 27; docs/performance.md#a-pinned-horizon).
PIN_CLAIM = 3.0  # claim p99 during the pin / before it
PIN_SIZE = 1.2  # soniq_jobs size at the end / before the pin
#: The text report lists the soniq indexes that reach this size (and every table).
RELATION_SHOWN = 64 * 1024


# The server -------------------------------------------------------------------


#: ``--diagnose``: every statement's time and buffers (pg_stat_statements, nested ones too)
#: and the plan of every one slower than 25 ms in the server log (auto_explain, row counts
#: and buffers, no timing); issue 27's slow minutes under a pin.
DIAGNOSE_OPTIONS = (
    "-c shared_preload_libraries=pg_stat_statements,auto_explain "
    "-c pg_stat_statements.track=all -c auto_explain.log_min_duration=25 "
    "-c auto_explain.log_nested_statements=on -c auto_explain.log_analyze=on "
    "-c auto_explain.log_timing=off -c auto_explain.log_buffers=on")


def soak_cluster(diagnose: bool = False):
    """A private cluster with stock settings (tests/chaos's, without its fsync=off)."""
    from tests.chaos.cluster import Cluster

    class SoakCluster(Cluster):
        def start(self) -> None:
            options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} "
                       "-c log_autovacuum_min_duration=0 -c log_checkpoints=on"
                       + (" " + DIAGNOSE_OPTIONS if diagnose else ""))
            result = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w",
                               "-t", "120", "-o", options, "start")
            self._check("pg_ctl start", result)
            self.running = True

    return SoakCluster(database=DB)


def postmaster_pid(cluster) -> int:
    return int((cluster.data / "postmaster.pid").read_text().split()[0])


# /proc --------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()  # fields from "state" on


def cpu_seconds(pid: int, children: bool = False) -> float:
    """utime + stime of ``pid`` (with ``children``: plus those of its reaped children)."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def server_cpu(postmaster: int) -> float:
    """The whole server's CPU: the postmaster, its reaped children, its live children."""
    total = cpu_seconds(postmaster, children=True)
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None and int(fields[1]) == postmaster:
                total += (int(fields[11]) + int(fields[12])) / TICK
    return total


# Processes ----------------------------------------------------------------------


class Run:
    """The server, the workers and the producer of one run; ``close()`` stops them all."""

    def __init__(self, cluster, opts, log_dir: Path):
        self.cluster = cluster
        self.opts = opts
        self.log_dir = log_dir
        self.workers: list[subprocess.Popen] = []
        self.producer: subprocess.Popen | None = None
        self.stamps_dir = Path(tempfile.mkdtemp(prefix="stamps-", dir=log_dir))
        self.offsets: dict[str, int] = {}
        self.tail: dict[str, bytes] = {}

    def env(self) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
        path = str(ROOT) if not self.opts.source else f"{self.opts.source}{os.pathsep}{ROOT}"
        env.update(PYTHONPATH=path, BENCH_DB_NAME=DB, PYTHONUNBUFFERED="1",
                   BENCH_DATABASE_URL=self.cluster.url("postgres"),
                   DJANGO_SETTINGS_MODULE="bench.soak_settings",
                   SOAK_RESULT_TTL=str(self.opts.result_ttl),
                   SOAK_STAMPS_DIR=str(self.stamps_dir))
        return env

    def migrate(self) -> None:
        subprocess.run([str(PROJECT_PY), "-m", "django", "migrate", "--skip-checks",
                        "--verbosity", "0"], cwd=self.cwd, env=self.env(), check=True)

    @property
    def cwd(self) -> Path:
        """Where the workers run: ``python -m`` puts it first on sys.path, ahead of PYTHONPATH."""
        return self.opts.source or ROOT

    def start_workers(self, tag: str) -> None:
        cmd = [str(PROJECT_PY), "-m", "django", "soniq_worker", "--concurrency",
               str(self.opts.concurrency), "--verbosity", "0"]
        for index in range(self.opts.workers):
            log = open(self.log_dir / f"worker-{tag}-{index}.log", "w")
            self.workers.append(subprocess.Popen(cmd, cwd=self.cwd, env=self.env(), stdout=log,
                                                 stderr=subprocess.STDOUT))
            log.close()

    def start_producer(self, rate: float | None, tag: str) -> None:
        cmd = [str(PROJECT_PY), "-m", "bench.soak", "--produce", str(rate or 0)]
        (self.log_dir / "produced").unlink(missing_ok=True)
        log = open(self.log_dir / f"producer-{tag}.log", "w")
        self.producer = subprocess.Popen(cmd, cwd=ROOT, env=self.env(), stdout=subprocess.PIPE,
                                         stderr=log, text=True)
        log.close()

    def produced(self) -> int:
        """How many jobs the producer has enqueued (it reports on each line it writes)."""
        path = self.log_dir / "produced"
        try:
            return int(path.read_text() or 0)
        except (OSError, ValueError):
            return 0

    def stop_producer(self) -> int:
        if self.producer is None:
            return 0
        self.producer.send_signal(signal.SIGTERM)
        out, _ = self.producer.communicate(timeout=60)
        self.producer = None
        return int(out.strip().splitlines()[-1]) if out.strip() else 0

    def stop_workers(self) -> None:
        for child in self.workers:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.workers:
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self.workers = []

    def worker_cpu(self) -> float:
        return sum(cpu_seconds(child.pid) for child in self.workers)

    def producer_cpu(self) -> float:
        return cpu_seconds(self.producer.pid) if self.producer else 0.0

    def new_stamps(self) -> list[tuple[float, float]]:
        """(enqueue time, start time) of every handler start since the last call."""
        found = []
        for name in os.listdir(self.stamps_dir):
            path = self.stamps_dir / name
            with open(path, "rb") as handle:
                handle.seek(self.offsets.get(name, 0))
                data = self.tail.get(name, b"") + handle.read()
                self.offsets[name] = handle.tell()
            lines = data.split(b"\n")
            self.tail[name] = lines.pop()  # an unfinished last line, if any
            for line in lines:
                t, started = line.split()
                found.append((float(t), float(started)))
        return found

    def close(self) -> None:
        if self.producer is not None and self.producer.poll() is None:
            self.producer.kill()
            self.producer.wait()
        self.stop_workers()


# The producer (its own process) ------------------------------------------------


def produce(rate: float, out: Path) -> None:
    """Enqueue one job per transaction, ``rate`` per second (0: as fast as possible)."""
    import psycopg

    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    params = dict(os.environ)
    conn = psycopg.connect(params["BENCH_DATABASE_URL"].rsplit("/", 1)[0] + "/" + DB,
                           autocommit=True)
    sent = 0
    started = time.perf_counter()
    last_report = started
    while not stop:
        now = time.perf_counter()
        due = int((now - started) * rate) + 1 if rate else sent + 50
        while sent < due and not stop:
            conn.execute(ENQUEUE, [JOB, '{"t": %.6f}' % time.time()], prepare=True)
            sent += 1
        if now - last_report >= 1.0:
            report(out, sent)
            last_report = now
        if rate:
            pause = started + sent / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
    conn.close()
    report(out, sent)
    print(sent, flush=True)


def report(out: Path, sent: int) -> None:
    """Write the count whole (a reader never sees a half-written file)."""
    part = out.with_suffix(".part")
    part.write_text(str(sent))
    part.replace(out)


# Measurements ------------------------------------------------------------------

TABLE_SQL = """
SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, n_tup_del, autovacuum_count,
       autoanalyze_count, pg_relation_size(relid), pg_indexes_size(relid),
       pg_total_relation_size(relid)
  FROM pg_stat_user_tables WHERE relname = 'soniq_jobs'
"""
TABLE_KEYS = ("live", "dead", "upd", "hot_upd", "deleted", "autovacuums", "autoanalyzes",
              "heap_bytes", "index_bytes", "total_bytes")
INDEX_SQL = """
SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes
 WHERE relname = 'soniq_jobs' ORDER BY indexrelname
"""
COUNT_SQL = "SELECT count(*) FILTER (WHERE status = 'queued'), count(*) FROM soniq_jobs"
#: Every soniq table and index of the schema: (name, table, bytes, live, dead); live and dead
#: tuples for tables only. A table's bytes are its main fork plus its TOAST table.
RELATIONS_SQL = r"""
SELECT c.relname, coalesce(t.relname, c.relname),
       pg_relation_size(c.oid) + CASE WHEN c.reltoastrelid <> 0
                                      THEN pg_total_relation_size(c.reltoastrelid) ELSE 0 END,
       s.n_live_tup, s.n_dead_tup
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
  LEFT JOIN pg_index i ON i.indexrelid = c.oid
  LEFT JOIN pg_class t ON t.oid = i.indrelid
  LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.relkind IN ('r', 'i') AND coalesce(t.relname, c.relname) LIKE 'soniq\_%'
 ORDER BY 2, c.relkind DESC, 1
"""
#: The server's write-ahead log, checkpoints and buffer reads since the statistics reset:
#: what a minute's row differences (issue 27: the slow minutes under a pin).
SERVER_SQL = """
SELECT w.wal_records, w.wal_fpi, w.wal_bytes::bigint,
       b.checkpoints_timed + b.checkpoints_req, b.buffers_checkpoint, b.buffers_backend,
       d.blks_read, d.blks_hit
  FROM pg_stat_wal w, pg_stat_bgwriter b, pg_stat_database d
 WHERE d.datname = current_database()
"""
SERVER_KEYS = ("wal_records", "wal_fpi", "wal_bytes", "checkpoints", "buffers_checkpoint",
               "buffers_backend", "blks_read", "blks_hit")


def snapshot(conn, run: Run, postmaster: int) -> dict:
    snap = dict(zip(TABLE_KEYS, conn.execute(TABLE_SQL).fetchone()))
    snap["indexes"] = dict(conn.execute(INDEX_SQL).fetchall())
    snap["relations"] = {name: (table, size, live, dead)
                         for name, table, size, live, dead in conn.execute(RELATIONS_SQL)}
    snap.update(zip(SERVER_KEYS, conn.execute(SERVER_SQL).fetchone()))
    held = horizon(conn)
    snap["horizon_holder"], snap["horizon_age"] = (held[0], held[2]) if held else ("", 0)
    snap["queued"], snap["rows"] = conn.execute(COUNT_SQL).fetchone()
    snap.update(at=time.time(), worker_cpu=run.worker_cpu(), server_cpu=server_cpu(postmaster),
                producer_cpu=run.producer_cpu(), produced=run.produced(),
                load=os.getloadavg()[0])
    return snap


def minute_row(minute: int, before: dict, after: dict, stamps: list,
               claims: list[float] | None = None, pinned: bool = False,
               probed: int = 0) -> dict:
    seconds = after["at"] - before["at"]
    claims = sorted(claims or [])
    started = len(stamps) + probed  # the claim probe's jobs ran too
    latencies = sorted((s - t) * 1000 for t, s in stamps)
    upd = after["upd"] - before["upd"]
    row = {
        "minute": minute,
        "enqueued_per_s": (after["produced"] - before["produced"]) / seconds,
        "started_per_s": started / seconds,
        "queued": after["queued"],
        "rows": after["rows"],
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "worker_cpu_ms_per_job": cpu_per_job(after["worker_cpu"] - before["worker_cpu"], started),
        "server_cpu_ms_per_job": cpu_per_job(after["server_cpu"] - before["server_cpu"], started),
        "producer_cpu_ms_per_job": cpu_per_job(after["producer_cpu"] - before["producer_cpu"],
                                               after["produced"] - before["produced"]),
        "heap_mb": after["heap_bytes"] / 2**20,
        "index_mb": after["index_bytes"] / 2**20,
        "total_mb": after["total_bytes"] / 2**20,
        "live": after["live"],
        "dead": after["dead"],
        "deleted": after["deleted"] - before["deleted"],
        "hot_pct": 100.0 * (after["hot_upd"] - before["hot_upd"]) / upd if upd else float("nan"),
        "autovacuums": after["autovacuums"] - before["autovacuums"],
        "autoanalyzes": after["autoanalyzes"] - before["autoanalyzes"],
        "load": after["load"],
        "claim_p50_ms": percentile(claims, 0.50),
        "claim_p99_ms": percentile(claims, 0.99),
        "pinned": int(pinned),
        "pin_lost": 0,
        "horizon_age": after["horizon_age"],
        "horizon_k": after["horizon_age"] / 1000,
        "horizon_holder": after["horizon_holder"],
    }
    for name, size in after["indexes"].items():
        row[f"idx_{name}_kb"] = size // 1024
    row.update(server_row(before, after, started))
    row["_relations"] = after["relations"]
    row["_latencies"] = latencies
    row["_claims"] = claims
    return row


def server_row(before: dict, after: dict, jobs: int) -> dict:
    """The minute's write-ahead log, checkpoints and buffer reads (pg_stat_wal, _bgwriter,
    _database differences)."""
    diff = {key: after[key] - before[key] for key in SERVER_KEYS}
    reads = diff["blks_read"] + diff["blks_hit"]
    return {
        "wal_mb": diff["wal_bytes"] / 2**20,
        "wal_bytes_per_job": diff["wal_bytes"] / jobs if jobs else float("nan"),
        "wal_fpi": diff["wal_fpi"],
        "checkpoints": diff["checkpoints"],
        "buffers_checkpoint": diff["buffers_checkpoint"],
        "buffers_backend": diff["buffers_backend"],
        "blks_read": diff["blks_read"],
        "hit_pct": 100.0 * diff["blks_hit"] / reads if reads else float("nan"),
    }


def cpu_per_job(seconds: float, jobs: int) -> float:
    return seconds * 1000 / jobs if jobs else float("nan")


def percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return float("nan")
    position = (len(ordered) - 1) * q
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def measure_max(run: Run, conn, seconds: float, say) -> float:
    """Handler starts per second with an unpaced producer, over the window's second half."""
    run.start_workers("max")
    time.sleep(3)
    run.start_producer(None, "max")
    time.sleep(seconds / 2)
    run.new_stamps()
    begin = time.time()
    time.sleep(seconds / 2)
    stamps = [s for _, s in run.new_stamps() if s >= begin]
    produced = run.stop_producer()
    run.stop_workers()
    rate = len(stamps) / (time.time() - begin)
    say(f"maximum: {rate:,.0f} jobs/s started over {seconds / 2:.0f} s with an unpaced "
        f"producer ({produced:,} enqueued in all)")
    conn.execute("TRUNCATE soniq_jobs, soniq_dead_letter_jobs, soniq_workers, soniq_throughput")
    conn.execute("VACUUM ANALYZE")
    conn.execute("SELECT pg_stat_reset()")
    conn.execute("CHECKPOINT")
    run.new_stamps()
    return rate


# Verdicts -------------------------------------------------------------------------


def verdicts(rows: list[dict], rate: float) -> list[tuple[str, str, str, str]]:
    """(figure, value, target, verdict) for each target of the soak.

    Windows: minutes 2 to WINDOW+1 against the last ``WINDOW`` (minute 1 is
    warm-up: new connections, cold caches, the first autovacuum of an empty
    table; on a run shorter than 2 x WINDOW + 1 minutes, each half of the
    minutes after the first). Latency p50/p99 over every job
    started in a window; CPU per job = CPU of the window / jobs of the window.
    Size: ``soniq_jobs`` heap + indexes (pg_total_relation_size); the first
    purge cycle is the first minute in which rows were deleted; bounded means
    the largest size of the last window is at most BOUNDED x the largest of
    the WINDOW minutes after that one. Drain kept up: the last window started
    at least 98% of what was enqueued in it, and the backlog at the end is
    under 10 s of enqueueing.
    """
    n = len(rows)
    warm = 1 if n >= 3 else 0
    w = min(WINDOW, (n - warm) // 2)
    out = []
    if w < 1:
        return [("(run too short for verdicts)", "", "", "n/a")]
    first, last = rows[warm:warm + w], rows[-w:]
    span = f"minutes {warm + 1}-{warm + w} -> last {w}"

    def joined(window, key):
        return sorted(x for row in window for x in row[key])

    def flat(label, a, b):
        ratio = b / a if a else float("nan")
        out.append((label, f"{a:.2f} -> {b:.2f} ({ratio:.2f}x)", f"<= {FLAT}x",
                    "met" if ratio <= FLAT else "MISSED"))

    for q, name in ((0.50, "p50"), (0.99, "p99")):
        flat(f"start latency {name} ms, {span}",
             percentile(joined(first, "_latencies"), q), percentile(joined(last, "_latencies"), q))
    for key, name in (("worker_cpu_ms_per_job", "worker"), ("server_cpu_ms_per_job", "server")):
        def per_job(window):
            jobs = sum(r["started_per_s"] for r in window)
            return sum(r[key] * r["started_per_s"] for r in window) / jobs if jobs else math.nan
        flat(f"{name} CPU ms/job, {span}", per_job(first), per_job(last))

    purged = [i for i, row in enumerate(rows) if row["deleted"] > 0]
    if not purged or purged[0] + 1 + WINDOW > n - WINDOW:
        out.append(("soniq_jobs size after the first purge", "", f"<= {BOUNDED}x",
                    "n/a (no purge, or too few minutes after it)"))
    else:
        p = purged[0]
        ref = max(r["total_mb"] for r in rows[p + 1:p + 1 + WINDOW])
        end = max(r["total_mb"] for r in rows[-WINDOW:])
        out.append((f"soniq_jobs size MB, max of minutes {p + 2}-{p + 1 + WINDOW} -> last {WINDOW}",
                    f"{ref:.1f} -> {end:.1f} ({end / ref:.2f}x)", f"<= {BOUNDED}x",
                    "met" if end <= BOUNDED * ref else "MISSED"))
    enq = sum(r["enqueued_per_s"] for r in last)
    done = sum(r["started_per_s"] for r in last)
    backlog = rows[-1]["queued"]
    kept = done >= 0.98 * enq and backlog < 10 * rate
    out.append((f"drain kept up: started/enqueued last {w}, backlog at end",
                f"{done / enq if enq else math.nan:.3f}, {backlog:,}",
                ">= 0.98, < 10 s of jobs", "met" if kept else "MISSED"))
    return out


def pin_verdicts(rows: list[dict], rate: float) -> list[tuple[str, str, str, str]]:
    """(figure, value, target, verdict) for the pinned horizon (issue 27).

    Before: the minutes before the pin but the first (warm-up); during: the
    pinned minutes; after: the minutes after the release. Claim time: every
    probe's claim of a window pooled. Kept up: jobs started during the pin at
    least 98 % of those enqueued, and the backlog at its end under 10 s of
    jobs. Size: ``soniq_jobs`` heap + indexes at the end of the run against
    the last minute before the pin, with no VACUUM FULL (autovacuum only).
    """
    before = [r for r in rows if not r["pinned"] and r["minute"] > 1
              and r["minute"] < min((x["minute"] for x in rows if x["pinned"]), default=0)]
    during = [r for r in rows if r["pinned"]]
    after = [r for r in rows if during and r["minute"] > during[-1]["minute"]]
    if not before or not during:
        return [("(no minutes before or during the pin)", "", "", "n/a")]

    def pooled(window, q):
        return percentile(sorted(x for r in window for x in r["_claims"]), q)

    out = []
    for q, name in ((0.50, "p50"), (0.99, "p99")):
        a, b = pooled(before, q), pooled(during, q)
        ratio = b / a if a else math.nan
        target = f"<= {PIN_CLAIM}x" if name == "p99" else "(shown)"
        verdict = ("met" if ratio <= PIN_CLAIM else "MISSED") if name == "p99" else "-"
        out.append((f"claim {name} ms, before -> during the pin", f"{a:.2f} -> {b:.2f} "
                    f"({ratio:.2f}x)", target, verdict))
    worst = max(r["claim_p99_ms"] for r in during)
    lost = [r["minute"] for r in during if r["pin_lost"]]
    ages = [r["horizon_age"] for r in during]
    grew = all(b > a for a, b in zip(ages, ages[1:]))
    out.append(("the primary's horizon held through the pin: oldest xmin age at its end",
                f"{ages[-1]:,} ({during[-1]['horizon_holder']})" if not lost
                else f"lost in minute {lost[0]}", "held, growing every minute",
                "met" if grew and not lost else "MISSED"))
    out.append(("claim p99 ms, worst pinned minute", f"{worst:.2f}", "(shown)", "-"))
    enq = sum(r["enqueued_per_s"] for r in during)
    done = sum(r["started_per_s"] for r in during)
    backlog = during[-1]["queued"]
    kept = done >= 0.98 * enq and backlog < 10 * rate
    out.append(("drain kept up during the pin: started/enqueued, backlog at release",
                f"{done / enq if enq else math.nan:.3f}, {backlog:,}", ">= 0.98, < 10 s of jobs",
                "met" if kept else "MISSED"))
    ref = before[-1]["total_mb"]
    peak = max(r["total_mb"] for r in during + after)
    if after:
        end = after[-1]["total_mb"]
        out.append((f"soniq_jobs size MB: before the pin -> peak -> {len(after)} min after",
                    f"{ref:.1f} -> {peak:.1f} -> {end:.1f} ({end / ref:.2f}x)",
                    f"<= {PIN_SIZE}x", "met" if end <= PIN_SIZE * ref else "MISSED"))
        a, b = pooled(before, 0.99), pooled(after[-min(len(after), WINDOW):], 0.99)
        out.append(("claim p99 ms, before the pin -> last minutes after it",
                    f"{a:.2f} -> {b:.2f} ({b / a if a else math.nan:.2f}x)", "(shown)", "-"))
    return out


# Output -----------------------------------------------------------------------------

COLUMNS = [  # (header, key, format)
    ("min", "minute", "{:>3d}"), ("enq/s", "enqueued_per_s", "{:>6.0f}"),
    ("done/s", "started_per_s", "{:>6.0f}"), ("queued", "queued", "{:>6d}"),
    ("p50ms", "p50_ms", "{:>6.1f}"), ("p99ms", "p99_ms", "{:>7.1f}"),
    ("wCPU", "worker_cpu_ms_per_job", "{:>5.2f}"), ("dbCPU", "server_cpu_ms_per_job", "{:>5.2f}"),
    ("heapMB", "heap_mb", "{:>6.1f}"), ("idxMB", "index_mb", "{:>6.1f}"),
    ("live", "live", "{:>7d}"), ("dead", "dead", "{:>7d}"), ("del/min", "deleted", "{:>7d}"),
    ("HOT%", "hot_pct", "{:>5.1f}"), ("av", "autovacuums", "{:>2d}"),
    ("aa", "autoanalyzes", "{:>2d}"), ("walMB", "wal_mb", "{:>5.1f}"),
    ("fpi", "wal_fpi", "{:>6d}"), ("ck", "checkpoints", "{:>2d}"), ("hit%", "hit_pct", "{:>5.1f}"),
    ("load", "load", "{:>4.1f}"),
]
#: Added to the table when the run has a claim probe (--pin-minutes).
PIN_COLUMNS = [("pin", "pinned", "{:>3d}"), ("hznK", "horizon_k", "{:>5.0f}"),
               ("cl50ms", "claim_p50_ms", "{:>6.2f}"),
               ("cl99ms", "claim_p99_ms", "{:>7.2f}")]


def columns(pin: bool) -> list[tuple[str, str, str]]:
    return COLUMNS + PIN_COLUMNS if pin else COLUMNS


def header_line(pin: bool = False) -> str:
    return " ".join(f"{h:>{len(fmt.format(0 if 'd' in fmt else 0.0))}}"
                    for h, _, fmt in columns(pin))


def format_row(row: dict, pin: bool = False) -> str:
    return " ".join(fmt.format(row[key]) for _, key, fmt in columns(pin))


def write_csv(rows: list[dict], path: Path) -> None:
    keys = [k for k in rows[0] if not k.startswith("_")]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in row.items()
                             if not k.startswith("_")})


def write_relations_csv(rows: list[dict], path: Path) -> None:
    """One line per minute and soniq relation: its size (kB) and, for a table, live and dead
    tuples."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["minute", "relation", "table", "kind", "size_kb", "live", "dead"])
        for row in rows:
            for name, (table, size, live, dead) in row["_relations"].items():
                kind = "table" if name == table else "index"
                writer.writerow([row["minute"], name, table, kind, size // 1024,
                                 "" if live is None else live, "" if dead is None else dead])


def relations_report(rows: list[dict], ref: dict, label: str) -> list[str]:
    """Every soniq table that has a page and every index of at least RELATION_SHOWN bytes at
    some minute, biggest first:
    its size at ``ref`` (the last minute before the pin, or the first), at its peak and at the
    end, and a table's dead tuples at the same three."""
    end = rows[-1]
    later = [r for r in rows if r["minute"] >= ref["minute"]]
    names = {name for r in later for name in r["_relations"]}

    def size(row, name):
        return row["_relations"].get(name, (None, 0, None, None))[1]

    def dead(row, name):
        value = row["_relations"].get(name, (None, 0, None, None))[3]
        return "" if value is None else f"{value:,}"

    peaks = {name: max(later, key=lambda r: size(r, name)) for name in names}
    tables = {table for r in later for table, _, _, _ in r["_relations"].values()}
    shown = sorted((n for n in names if size(peaks[n], n) >= RELATION_SHOWN
                    or (n in tables and size(peaks[n], n) > 0)),
                   key=lambda n: -size(peaks[n], n))
    mb = 2**20
    out = [f"{'relation (MB; dead tuples of a table)':<44} {label:>8} {'peak':>8} {'at':>3} "
           f"{'end':>8} {'end/ref':>7} {'dead ' + label:>12} {'dead peak':>10} {'dead end':>10}"]
    for name in shown:
        peak = peaks[name]
        ratio = size(end, name) / size(ref, name) if size(ref, name) else math.nan
        out.append(f"{name:<44} {size(ref, name) / mb:>8.2f} {size(peak, name) / mb:>8.2f} "
                   f"{peak['minute']:>3d} {size(end, name) / mb:>8.2f} {ratio:>7.2f} "
                   f"{dead(ref, name):>12} {dead(peak, name):>10} {dead(end, name):>10}")

    def jobs_total(row):
        return sum(size for table, size, _, _ in row["_relations"].values()
                   if table == "soniq_jobs") / mb

    top = max(later, key=jobs_total)
    out.append(f"{'soniq_jobs + its indexes':<44} {jobs_total(ref):>8.2f} {jobs_total(top):>8.2f} "
               f"{top['minute']:>3d} {jobs_total(end):>8.2f} "
               f"{jobs_total(end) / jobs_total(ref) if jobs_total(ref) else math.nan:>7.2f}")
    return out


def plot(csv_path: Path, png: Path, title: str) -> None:
    """Four panels over the minutes: rate, latency, CPU per job, sizes and dead tuples."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path) as handle:
        rows = list(csv.DictReader(handle))
    x = [int(r["minute"]) for r in rows]

    def col(key):
        return [float(r[key]) for r in rows]

    fig, axes = plt.subplots(4, 1, figsize=(9, 11), sharex=True)
    axes[0].plot(x, col("enqueued_per_s"), label="enqueued/s")
    axes[0].plot(x, col("started_per_s"), label="started/s")
    axes[0].set_ylabel("jobs/s")
    axes[1].plot(x, col("p50_ms"), label="p50")
    axes[1].plot(x, col("p99_ms"), label="p99")
    axes[1].set_ylabel("start latency, ms")
    axes[1].set_yscale("log")
    axes[2].plot(x, col("worker_cpu_ms_per_job"), label="workers")
    axes[2].plot(x, col("server_cpu_ms_per_job"), label="PostgreSQL")
    axes[2].plot(x, col("producer_cpu_ms_per_job"), label="producer")
    axes[2].set_ylabel("CPU ms per job")
    axes[3].plot(x, col("heap_mb"), label="heap MB")
    axes[3].plot(x, col("index_mb"), label="indexes MB")
    axes[3].set_ylabel("MB")
    dead = axes[3].twinx()
    dead.plot(x, [v / 1000 for v in col("dead")], color="grey", linestyle=":", label="dead tuples (k)")
    dead.set_ylabel("dead tuples, thousands")
    for minute, runs in zip(x, col("autovacuums")):
        if runs:
            axes[3].axvline(minute, color="green", alpha=0.25)
    axes[3].set_xlabel("minute (green: an autovacuum of soniq_jobs)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    dead.legend(loc="upper right", fontsize=8)
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(title, 110)), fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=90)


# Main -------------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=30, help="length of the soak (30)")
    parser.add_argument("--rate", type=float, help="jobs/s to enqueue (default: half the measured maximum)")
    parser.add_argument("--fraction", type=float, default=0.5,
                        help="share of the measured maximum to enqueue at (0.5)")
    parser.add_argument("--measure-seconds", type=float, default=20)
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--concurrency", type=int, default=4, help="--concurrency of each (4)")
    parser.add_argument("--result-ttl", type=float, default=120, help="RESULT_TTL, s (120)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results",
                        help="directory of the CSV, the text report and the plot")
    parser.add_argument("--name", help="file name stem (default soak-<UTC time>)")
    parser.add_argument("--plot", type=Path, help="where the PNG goes (default next to the CSV)")
    parser.add_argument("--preload-done", type=int, default=0, metavar="N",
                        help="start with N finished rows that expire only after the run: "
                             "a big soniq_jobs (results kept long, or a history) under the same load")
    parser.add_argument("--pin-minutes", type=int, default=0, metavar="P",
                        help="hold a REPEATABLE READ snapshot open for P minutes (issue 27; "
                             "--minutes becomes --pin-start + P + --pin-after)")
    parser.add_argument("--pin-start", type=int, default=5, metavar="S",
                        help="minutes of soak before the pin (5)")
    parser.add_argument("--pin-after", type=int, default=10, metavar="A",
                        help="minutes of soak after the pin's release (10)")
    parser.add_argument("--pin-via", choices=("session", "standby"), default="session",
                        help="who holds the snapshot: a session on the server (session), or "
                             "one on a streaming standby with hot_standby_feedback = on "
                             "(standby); bench/pinning.py")
    parser.add_argument("--diagnose", action="store_true",
                        help="pg_stat_statements and auto_explain (> 25 ms) on the cluster: "
                             "statements.csv (each minute's top statements) and the slow "
                             "plans in the server log, both in the log directory")
    parser.add_argument("--source", type=Path,
                        help="a directory whose soniq_django package the run uses instead of "
                             "this tree's (e.g. `git archive main soniq_django | tar -x -C DIR`)")
    parser.add_argument("--produce", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--plot-only", nargs=3, metavar=("CSV", "PNG", "TITLE"),
                        help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.pin_minutes:
        opts.minutes = opts.pin_start + opts.pin_minutes + opts.pin_after
    return opts


def header(opts, rate: float, maximum: float | None) -> str:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return "?"

    dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    if opts.source:
        dirty += f", soniq_django from {opts.source}"
    source = f"max {maximum:,.0f} jobs/s measured, x{opts.fraction}" if maximum else "--rate"
    return (f"soniq_django soak — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"HEAD {git('rev-parse', '--short', 'HEAD')}{dirty}; {opts.minutes} min at "
            f"{rate:,.0f} jobs/s ({source}); {opts.workers} worker proc x conc "
            f"{opts.concurrency}; RESULT_TTL {opts.result_ttl:.0f} s; "
            + (f"{opts.preload_done:,} finished rows preloaded; " if opts.preload_done else "")
            + (f"a REPEATABLE READ snapshot held from minute {opts.pin_start} for "
               f"{opts.pin_minutes} min"
               + (" on a streaming standby with hot_standby_feedback = on; "
                  if opts.pin_via == "standby" else "; ") if opts.pin_minutes else "")
            + "private PostgreSQL "
            f"cluster, stock settings (autovacuum on); {os.cpu_count()} CPUs shared with "
            f"whatever else runs")


def _terminate(signum, frame):
    raise SystemExit(f"stopped by signal {signum}")  # so that the cluster and workers go too


def soak(opts) -> int:
    import psycopg

    signal.signal(signal.SIGTERM, _terminate)

    opts.out.mkdir(parents=True, exist_ok=True)
    name = opts.name or time.strftime("pin-%Y%m%d-%H%M" if opts.pin_minutes else
                                      "soak-%Y%m%d-%H%M", time.gmtime())
    report_lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        report_lines.append(text)

    log_dir = Path(tempfile.mkdtemp(prefix=f"soniq-soak-{os.getpid()}-", dir="/tmp"))
    with soak_cluster(opts.diagnose) as cluster:
        run = Run(cluster, opts, log_dir)
        try:
            run.migrate()
            with psycopg.connect(cluster.url(DB), autocommit=True) as conn:
                if opts.diagnose:
                    conn.execute("CREATE EXTENSION pg_stat_statements")
                version = conn.execute("SHOW server_version").fetchone()[0]
                autovac = conn.execute("SHOW autovacuum").fetchone()[0]
                print(f"cluster: PostgreSQL {version}, autovacuum={autovac}, logs in {log_dir}",
                      flush=True)
                maximum = None
                if opts.rate is None:
                    maximum = measure_max(run, conn, opts.measure_seconds, print)
                rate = opts.rate or maximum * opts.fraction
                if opts.preload_done:
                    preload_done(conn, opts.preload_done)
                standby = (standby_of(cluster, DB, log_dir / "standby.log")
                           if opts.pin_minutes and opts.pin_via == "standby" else None)
                if standby is None:
                    rows = soak_minutes(run, conn, cluster, opts, rate)
                else:
                    with standby:
                        print(f"standby: streaming from the primary on port {standby.port}, "
                              "hot_standby_feedback = on", flush=True)
                        rows = soak_minutes(run, conn, cluster, opts, rate, standby)
            shutil_copy(cluster.log_path, log_dir / "server.log")
        finally:
            run.close()
    say(header(opts, rate, maximum))
    pinned = bool(opts.pin_minutes)
    say(header_line(pinned))
    for row in rows:
        say(format_row(row, pinned))
    say()
    say(f"{'figure':<60} {'value':<28} {'target':<24} verdict")
    missed = 0
    for figure, value, target, verdict in (pin_verdicts(rows, rate) if pinned
                                           else verdicts(rows, rate)):
        missed += verdict == "MISSED"
        say(f"{figure:<60} {value:<28} {target:<24} {verdict}")
    say()
    first_pinned = next((r for r in rows if r["pinned"]), None)
    if first_pinned is not None and first_pinned["minute"] > 1:
        ref, label = rows[first_pinned["minute"] - 2], "pre-pin"
    else:
        ref, label = rows[0], "min 1"
    for line in relations_report(rows, ref, label):
        say(line)
    csv_path = opts.out / f"{name}.csv"
    write_csv(rows, csv_path)
    write_relations_csv(rows, opts.out / f"{name}-relations.csv")
    (opts.out / f"{name}.txt").write_text("\n".join(report_lines) + "\n")
    png = opts.plot or opts.out / f"{name}.png"
    if PLOT_PY.exists():
        title = report_lines[0]
        subprocess.run([str(PLOT_PY), "-m", "bench.soak", "--plot-only", str(csv_path), str(png),
                        title], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
        print(f"plot: {png}")
    else:
        print("no plot: bench/.venv-plot is missing (bash bench/plot-venv.sh makes it)")
    print(f"table: {opts.out / name}.txt, CSV: {csv_path}; worker and server logs: {log_dir}")
    return 1 if missed else 0


def shutil_copy(src: Path, dst: Path) -> None:
    import shutil

    try:
        shutil.copy(src, dst)
    except OSError:
        pass


def preload_done(conn, count: int) -> None:
    """``count`` finished rows, as soniq's completion leaves them, expiring in a day."""
    conn.execute(
        "INSERT INTO soniq_jobs (id, job_name, args, status, attempts, max_attempts, queue, "
        "priority, unique_job, producer_id, created_at, updated_at, expires_at) "
        "SELECT gen_random_uuid(), %s, jsonb_build_object('t', 0), 'done', 1, 4, 'default', "
        "100, false, 'soak', now() - interval '1 hour', now(), now() + interval '1 day' "
        "FROM generate_series(1, %s)", [JOB, count])
    conn.execute("VACUUM ANALYZE soniq_jobs")
    conn.execute("SELECT pg_stat_reset()")


def soak_minutes(run: Run, conn, cluster, opts, rate: float, standby=None) -> list[dict]:
    postmaster = postmaster_pid(cluster)
    run.start_workers("soak")
    time.sleep(3)
    run.start_producer(rate, "soak")
    print(f"soak: {opts.minutes} min at {rate:,.0f} jobs/s", flush=True)
    pinning = bool(opts.pin_minutes)
    probe = ClaimProbe(cluster.url(DB)).start() if pinning else None
    pin: Pin | None = None
    pin_ends = opts.pin_start + opts.pin_minutes
    print(header_line(pinning), flush=True)
    before = snapshot(conn, run, postmaster)
    statements = top_statements(conn, 0, None, run.log_dir) if opts.diagnose else None
    started = before["at"]
    rows = []
    try:
        for minute in range(1, opts.minutes + 1):
            pinned = pin is not None
            end = started + 60 * minute
            time.sleep(max(0.0, end - time.time()))
            row, before = _minute(run, conn, postmaster, minute, before, probe, pinned)
            if opts.diagnose:
                statements = top_statements(conn, minute, statements, run.log_dir)
            if pin is not None and not pin.held():
                row["pin_lost"] = 1
                print(f"pin: LOST in minute {minute} ({pin.lost})", flush=True)
            print(format_row(row, pinning), flush=True)
            if not pinning and WINDOW + 1 < minute <= opts.minutes - WINDOW:
                row["_latencies"] = []  # only the first and last windows' are needed
            rows.append(row)
            if pinning and minute == opts.pin_start:
                pin = Pin((standby or cluster).url(DB))
                where = "on the standby" if standby else "on the primary"
                print(f"pin: a REPEATABLE READ snapshot {where} (xmin {pin.xmin}) held for "
                      f"{opts.pin_minutes} min; the primary's horizon is held by "
                      f"{wait_for_horizon(conn, pin.xmin)}", flush=True)
            elif pin is not None and minute >= pin_ends:
                pin.release()
                pin = None
                print("pin: released", flush=True)
    finally:
        if pin is not None:
            pin.release()
        if probe is not None:
            probe.stop()
            with open(run.log_dir / "claims.csv", "w") as handle:
                handle.write("at,ms\n")
                handle.writelines(f"{at:.3f},{ms:.3f}\n" for at, ms in probe.trace)
    run.stop_producer()
    return rows


STATEMENTS_SQL = """
SELECT queryid, left(regexp_replace(query, '\\s+', ' ', 'g'), 90), calls, total_exec_time,
       shared_blks_hit + shared_blks_read, wal_fpi
  FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def top_statements(conn, minute: int, before: dict | None, log_dir: Path) -> dict:
    """Append the minute's ten most time-consuming statements to statements.csv (``--diagnose``):
    calls, ms per call, buffers per call, full-page images; returns the counters now."""
    now = {qid: rest for qid, *rest in conn.execute(STATEMENTS_SQL)}
    if before is not None:
        diffs = []
        for qid, (text, calls, ms, blocks, fpi) in now.items():
            b = before.get(qid, (text, 0, 0.0, 0, 0))
            if calls > b[1]:
                diffs.append((ms - b[2], calls - b[1], blocks - b[3], fpi - b[4], text))
        path = log_dir / "statements.csv"
        new = not path.exists()
        with open(path, "a", newline="") as handle:
            writer = csv.writer(handle)
            if new:
                writer.writerow(["minute", "total_ms", "calls", "ms_per_call", "blocks_per_call",
                                 "fpi", "statement"])
            for ms, calls, blocks, fpi, text in sorted(diffs, reverse=True)[:10]:
                writer.writerow([minute, f"{ms:.0f}", calls, f"{ms / calls:.3f}",
                                 f"{blocks / calls:.1f}", fpi, text])
    return now


def _minute(run: Run, conn, postmaster: int, minute: int, before: dict,
            probe: "ClaimProbe | None", pinned: bool) -> tuple[dict, dict]:
    """The row of one minute, and the snapshot the next one starts from."""
    if run.producer is None or run.producer.poll() is not None:
        raise RuntimeError("the producer died: see its log in " + str(run.log_dir))
    if any(child.poll() is not None for child in run.workers):
        raise RuntimeError("a worker died: see its log in " + str(run.log_dir))
    stamps = run.new_stamps()
    after = snapshot(conn, run, postmaster)
    claims, probed = probe.take() if probe is not None else (None, 0)
    return minute_row(minute, before, after, stamps, claims, pinned, probed), after


def main(argv=None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if opts.produce is not None:
        produce(opts.produce, Path(os.environ["SOAK_STAMPS_DIR"]).parent / "produced")
        return 0
    if opts.plot_only:
        csv_path, png, title = opts.plot_only
        plot(Path(csv_path), Path(png), title)
        return 0
    return soak(opts)


if __name__ == "__main__":
    sys.exit(main())
