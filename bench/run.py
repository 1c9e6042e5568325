"""Run the benchmarks and print one table: ``python -m bench.run [--quick]``.

The orchestrator runs in the project's .venv. soniq_django's producers and
workers run as child processes of the same .venv; the peers (django-tasks-db,
procrastinate, pgqueuer) as child processes of bench/.venv-peers. Each run
creates one database per system, ``soniq_bench_<pid>_<system>``, on the local
PostgreSQL (BENCH_DATABASE_URL, default postgres@127.0.0.1:5432; loopback
only) and drops them at the end, also on failure or Ctrl-C.

Drains: the queue is preloaded with --drain-jobs jobs, statistics refreshed
and a CHECKPOINT taken, then the workers start. Every handler records the
time it started; the rate is (jobs - 1) / (last start - first start), from
the merged stamps of all worker processes. With --window W the workers are
stopped (SIGTERM, graceful) W seconds after the first claim if the queue is
not empty by then; --full-drain drains every job of every configuration.

See docs/performance.md for what each row means.
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import drain_race, raw, steps, wal, workflows
from bench.common import (
    connect,
    create_database,
    drop_database,
    parse_result,
    percentile,
    read_stamps,
    quiesce,
    summary,
)

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PY = ROOT / ".venv" / "bin" / "python"
PEERS_PY = ROOT / "bench" / ".venv-peers" / "bin" / "python"
PEERS = ("django-tasks-db", "procrastinate", "pgqueuer")
SONIQ_SOURCE: str | None = None  # a `git archive` of --soniq-rev, else the working tree


def _snapshot(rev: str, into: Path) -> str:
    """Extract soniq_django as committed at ``rev`` into ``into``; return its short hash."""
    into.mkdir()
    archive = subprocess.run(["git", "archive", "--format=tar", rev, "soniq_django"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()


def _check_snapshot_is_imported(system: "System") -> None:
    """Fail unless a child of ``system`` (and this process) import soniq_django from SONIQ_SOURCE."""
    import soniq_django

    probe = subprocess.run([str(system.python), "-c", "import soniq_django; print(soniq_django.__file__)"],
                           cwd=ROOT, env=system.env(), capture_output=True, text=True, check=True)
    for where, found in (("this process", soniq_django.__file__),
                         ("a child process", probe.stdout.strip())):
        if not str(Path(found).resolve()).startswith(str(Path(SONIQ_SOURCE or "").resolve())):
            raise SystemExit(f"bench: --soniq-rev: {where} imports soniq_django from {found}, "
                             f"not from the snapshot in {SONIQ_SOURCE}")


# Child processes -------------------------------------------------------------

_children: list[subprocess.Popen] = []


def _stop_children() -> None:
    for child in _children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + 10
    for child in _children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    _children.clear()


def _on_signal(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@dataclass
class System:
    name: str
    python: Path
    module: str  # producer actions: python -m MODULE ACTION [COUNT]
    settings: str | None  # DJANGO_SETTINGS_MODULE, for the Django-based ones
    queued_sql: str
    done_sql: str
    reset_sql: str
    db: str = ""
    log_dir: Path = field(default_factory=Path)

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DJANGO_")}
        path = str(ROOT)
        if SONIQ_SOURCE and self.python == PROJECT_PY:
            path = f"{SONIQ_SOURCE}{os.pathsep}{path}"  # ahead of the editable install
            # ``python -m`` would put the working directory (ROOT, whose
            # soniq_django is the working tree's) ahead of PYTHONPATH.
            env["PYTHONSAFEPATH"] = "1"
        env.update(PYTHONPATH=path, BENCH_DB_NAME=self.db, PYTHONUNBUFFERED="1")
        if self.settings:
            env["DJANGO_SETTINGS_MODULE"] = self.settings
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def action(self, *args, timeout: float = 600, **env) -> dict:
        """Run ``python -m module ARGS`` to completion; return its BENCH_RESULT."""
        cmd = [str(self.python), "-m", self.module, *map(str, args)]
        child = subprocess.Popen(cmd, cwd=ROOT, env=self.env(**env), text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _children.append(child)
        try:
            out, err = child.communicate(timeout=timeout)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            _children.remove(child)
        if child.returncode != 0:
            raise RuntimeError(f"{self.name} {' '.join(map(str, args))} failed "
                               f"(exit {child.returncode}):\n{err[-3000:]}")
        return parse_result(out)

    def worker_cmds(self, concurrency: int, processes: int, mode: str) -> list[tuple[list, dict]]:
        """The worker commands (with extra environment) for one drain or latency run."""
        py = str(self.python)
        if self.name == "soniq":
            # -v 0, as db_worker below: without LOGGING the worker would print a line per job.
            cmd = [py, "-m", "django", "soniq_worker", "--concurrency", str(concurrency),
                   "--verbosity", "0"]
            return [(cmd + (["--burst"] if mode == "drain" else []), {})] * processes
        if self.name == "django-tasks-db":
            # One task at a time per process: concurrency N is N processes.
            cmd = [py, "-m", "django", "db_worker", "--no-startup-delay", "--verbosity", "0"]
            return [(cmd + (["--batch"] if mode == "drain" else []), {})] * (concurrency * processes)
        if self.name == "procrastinate":
            cmd = [py, "-m", "bench.peers.procrastinate_bench",
                   "worker" if mode == "drain" else "worker-wait", "0", str(concurrency)]
            return [(cmd, {"BENCH_POOL_SIZE": max(4, concurrency + 2)})] * processes
        if self.name == "pgqueuer":
            cmd = [py, "-m", "bench.peers.pgqueuer_bench", "worker", "0", str(concurrency),
                   "drain" if mode == "drain" else "continuous"]
            return [(cmd, {})] * processes
        raise ValueError(self.name)

    def preload(self, count: int, job_name: str = "bench.noop") -> None:
        """Queue ``count`` jobs, no-op ones unless ``job_name`` says otherwise (not measured)."""
        if self.name != "soniq":
            assert job_name == "bench.noop", "the peers have only the no-op job"
            self.action("preload", count)
            return
        # The rows soniq_enqueue() writes, in one statement (bulk_enqueue is measured
        # on its own); created_at 1 µs apart, as separate enqueues would be.
        with connect(self.db) as conn:
            conn.execute(
                "INSERT INTO soniq_jobs (id, job_name, args, status, attempts, max_attempts, "
                "queue, priority, unique_job, producer_id, created_at, updated_at) "
                "SELECT gen_random_uuid(), %s, jsonb_build_object('i', g), 'queued', "
                "0, 4, 'default', 100, false, 'bench', now() + g * interval '1 microsecond', "
                "now() FROM generate_series(1, %s) AS g", [job_name, count])

    def sql(self, query: str) -> int:
        with connect(self.db) as conn:
            return conn.execute(query).fetchone()[0]

    def reset(self) -> None:
        with connect(self.db) as conn:
            conn.execute(self.reset_sql)


def make_systems(pid: int, log_dir: Path) -> dict[str, System]:
    systems = [
        System("soniq", PROJECT_PY, "bench.soniq_tasks", "bench.soniq_settings",
               "SELECT count(*) FROM soniq_jobs WHERE status = 'queued'",
               "SELECT count(*) FROM soniq_jobs WHERE status = 'done'",
               "TRUNCATE soniq_jobs, soniq_dead_letter_jobs, soniq_workers, soniq_throughput, "
               "soniq_queue_settings, soniq_queue_starts"),
        System("django-tasks-db", PEERS_PY, "bench.peers.dtdb", "bench.peers.dtdb_settings",
               "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'READY'",
               "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'",
               "TRUNCATE django_tasks_database_dbtaskresult"),
        System("procrastinate", PEERS_PY, "bench.peers.procrastinate_bench", None,
               "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'",
               "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
               "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_workers CASCADE"),
        System("pgqueuer", PEERS_PY, "bench.peers.pgqueuer_bench", None,
               "SELECT count(*) FROM pgqueuer WHERE status = 'queued'",
               "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
               "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics"),
    ]
    short = {"soniq": "soniq", "django-tasks-db": "dtdb", "procrastinate": "procr",
             "pgqueuer": "pgq"}
    for system in systems:
        system.db = f"soniq_bench_{pid}_{short[system.name]}"
        system.log_dir = log_dir
    return {system.name: system for system in systems}


# Drains ---------------------------------------------------------------------

#: Flow control on the drained queue for the "queue limit" rows: (concurrency, rate
#: limit, rate period), far above what the drain reaches, so they never bind.
FLOW_LIMITS = {"limited": (100_000, None, None), "rated": (None, 1_000_000, 1)}


def _rss_kb(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def run_workers(system: System, concurrency: int, processes: int, mode: str, stamps_dir: Path,
                *, until, timeout: float, rss: bool = False, profile: Path | None = None,
                env: dict | None = None):
    """Start the workers, call ``until(procs)`` until it returns True, stop them.

    Returns (seconds the workers ran, rss samples [(t, kB)] of the first process).
    """
    procs = []
    logs = []
    for index, (cmd, extra) in enumerate(system.worker_cmds(concurrency, processes, mode)):
        if profile is not None and index == 0:
            cmd = [str(PEERS_PY.parent / "py-spy"), "record", "--rate", "250", "--threads",
                   "--idle", "--format", "raw", "--output", str(profile), "--", *cmd]
        log = open(system.log_dir / f"{system.name}-{mode}-{index}.log", "w")
        logs.append(log)
        child = subprocess.Popen(cmd, cwd=ROOT, env=system.env(BENCH_STAMPS_DIR=stamps_dir,
                                                                 **extra, **(env or {})),
                                 stdout=log, stderr=subprocess.STDOUT)
        _children.append(child)
        procs.append(child)
    samples: list[tuple[float, int]] = []
    started = time.perf_counter()
    try:
        while True:
            if rss:
                value = _rss_kb(procs[0].pid)
                if value is not None:
                    samples.append((time.perf_counter(), value))
            if until(procs):
                break
            if time.perf_counter() - started > timeout:
                raise RuntimeError(f"{system.name}: workers did not finish in {timeout:.0f} s")
            time.sleep(0.1 if rss else 0.05)
    finally:
        signaled = [child for child in procs if child.poll() is None]
        for child in signaled:
            child.send_signal(signal.SIGINT if profile is not None else signal.SIGTERM)
        for child in procs:
            try:
                child.wait(60)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            _children.remove(child)
        for log in logs:
            log.close()
    # A worker we stopped may exit as its shutdown path likes (django-tasks-db exits 1 when
    # the signal lands inside its claim transaction); one that stopped by itself must be 0.
    failed = [c for c in procs if c not in signaled and c.returncode != 0]
    if failed and profile is None:
        tail = (system.log_dir / f"{system.name}-{mode}-0.log").read_text()[-3000:]
        raise RuntimeError(f"{system.name} worker exited with {failed[0].returncode}:\n{tail}")
    return time.perf_counter() - started, samples


def drain(system: System, cfg, concurrency: int, processes: int, *, jobs: int | None = None,
          window: float | None = None, rss: bool = False, profile: Path | None = None,
          env: dict | None = None, job_name: str = "bench.noop") -> dict:
    jobs = jobs or cfg.drain_jobs
    window = cfg.window if window is None else window
    system.reset()
    system.preload(jobs, job_name)
    quiesce(system.db)
    stamps_dir = Path(tempfile.mkdtemp(prefix="stamps-", dir=system.log_dir))
    state = {"first": None, "stopped": False, "drained_at": None}

    def until(procs) -> bool:
        queued = system.sql(system.queued_sql)
        now = time.perf_counter()
        if queued < jobs and state["first"] is None:
            state["first"] = now
        if queued == 0 and state["drained_at"] is None:
            state["drained_at"] = now
        if all(child.poll() is not None for child in procs):
            return True
        # The window cuts a drain that is still going. Once the queue is empty
        # the burst workers exit by themselves: a signal then could land after
        # the worker gave its signal handlers back, and kill it before its
        # stamps are written.
        if (window and state["first"] is not None and state["drained_at"] is None
                and now - state["first"] > window):
            state["stopped"] = True
            return True
        return False

    _, samples = run_workers(system, concurrency, processes, "drain", stamps_dir, until=until,
                             timeout=cfg.drain_timeout, rss=rss, profile=profile, env=env)
    stamps = sorted(read_stamps(str(stamps_dir)))
    shutil.rmtree(stamps_dir, ignore_errors=True)
    finished = system.sql(system.done_sql)
    if len(stamps) < 2:
        raise RuntimeError(f"{system.name}: fewer than two jobs ran")
    if not state["stopped"] and profile is None and (finished != jobs or len(stamps) != jobs):
        raise RuntimeError(f"{system.name}: drained {finished} of {jobs} jobs "
                           f"({len(stamps)} handler runs)")
    result = {"rate": (len(stamps) - 1) / (stamps[-1] - stamps[0]), "jobs": len(stamps),
              "finished": finished}
    if rss and samples:
        # The drain proper: from the first claim until the queue was empty.
        begin = state["first"] or samples[0][0]
        end = state["drained_at"] or samples[-1][0]
        during = [kb for t, kb in samples if begin <= t <= end] or [kb for _, kb in samples]
        quarter = max(1, len(during) // 4)
        first_q = statistics.median(during[:quarter])
        last_q = statistics.median(during[-quarter:])
        result.update(peak_kb=max(kb for _, kb in samples), first_q_kb=first_q,
                      last_q_kb=last_q, growth=(last_q - first_q) / first_q,
                      samples=len(during))
    return result


def latency(system: System, cfg) -> dict:
    """Enqueue-to-start on one idle worker (concurrency 1) that waits for work."""
    system.reset()
    quiesce(system.db)
    stamps_dir = Path(tempfile.mkdtemp(prefix="stamps-", dir=system.log_dir))
    state: dict = {}

    def until(procs) -> bool:
        if any(child.poll() is not None for child in procs):
            raise RuntimeError(f"{system.name}: the idle worker exited")
        if "started" not in state:
            state["started"] = time.perf_counter()
        if time.perf_counter() - state["started"] < cfg.idle_warmup:
            return False  # let it start, LISTEN and go idle
        state["sent"] = system.action("latency", cfg.latency_jobs)["sent"]
        time.sleep(1.0)  # the last job
        return True

    run_workers(system, 1, 1, "latency", stamps_dir, until=until, timeout=600)
    starts = {int(key): t for key, t in
              (s for s in read_stamps(str(stamps_dir)) if isinstance(s, list))}
    shutil.rmtree(stamps_dir, ignore_errors=True)
    sent = {int(k): v for k, v in state["sent"].items()}
    missing = set(sent) - set(starts)
    if missing:
        raise RuntimeError(f"{system.name}: {len(missing)} latency jobs did not run")
    after = [(starts[i] - sent[i][1]) * 1000 for i in sent]
    before = [(starts[i] - sent[i][0]) * 1000 for i in sent]
    return {"p50": percentile(after, 0.5), "p99": percentile(after, 0.99),
            "p50_call": percentile(before, 0.5), "p99_call": percentile(before, 0.99),
            "jobs": len(after)}


# The run ----------------------------------------------------------------------


class Results:
    def __init__(self):
        self.values: dict[str, list[float]] = {}
        self.notes: dict[str, str] = {}

    def add(self, key: str, value: float) -> None:
        self.values.setdefault(key, []).append(value)
        print(f"  {key:<44} {value:>12,.1f}", flush=True)

    def median(self, key: str) -> float | None:
        values = self.values.get(key)
        return statistics.median(values) if values else None


def enqueue_interleaved(raw_db: str, soniq_db: str, count: int, chunk: int = 25) -> dict:
    """Rates of raw INSERT, soniq_django.enqueue() and SELECT soniq_enqueue(), one job per
    transaction each, measured in alternating chunks (Django runs in this process)."""
    from soniq_django import enqueue

    from django.db import connection

    paths = {"raw.insert": connect(raw_db), "soniq.enqueue": None, "soniq.sqlfn": connect(soniq_db)}
    calls = {
        "raw.insert": lambda i: paths["raw.insert"].execute(
            raw.RAW_INSERT, ["bench.noop", '{"i": %d}' % i], prepare=True),
        "soniq.enqueue": lambda i: enqueue("bench.noop", {"i": i}),
        "soniq.sqlfn": lambda i: paths["soniq.sqlfn"].execute(
            raw.SONIQ_ENQUEUE, ["bench.noop", '{"i": %d}' % i], prepare=True),
    }
    spent = dict.fromkeys(calls, 0.0)
    for call in calls.values():
        call(-1)  # connect, prepare, warm up
    done = 0
    while done < count:
        n = min(chunk, count - done)
        for key, call in calls.items():
            started = time.perf_counter()
            for i in range(done, done + n):
                call(i)
            spent[key] += time.perf_counter() - started
        done += n
    for conn in (paths["raw.insert"], paths["soniq.sqlfn"]):
        conn.close()
    connection.close()
    return {key: count / seconds for key, seconds in spent.items()}


WRITE_JOBS = {"plain": "bench.write", "atomic": "bench.write_atomic"}


def write_drain(soniq: System, cfg, concurrency: int, kind: str) -> dict:
    """A drain of jobs whose handler writes one row (bench/soniq_app/jobs.py), plain or atomic.

    Afterwards the effects table must hold one row per handler run that
    wrote, none twice, and (atomic) exactly one per job done.
    """
    with connect(soniq.db) as conn:
        conn.execute("TRUNCATE bench_effects")
    found = drain(soniq, cfg, concurrency, 1, job_name=WRITE_JOBS[kind])
    with connect(soniq.db) as conn:
        rows, distinct = conn.execute("SELECT count(*), count(DISTINCT i) FROM bench_effects"
                                      ).fetchone()
    if rows != distinct or (kind == "atomic" and rows != found["finished"]):
        raise RuntimeError(f"soniq {kind} writes: {rows} effects rows ({distinct} distinct) "
                           f"for {found['finished']} jobs done")
    return found


def measure_writes(cfg, soniq: System, res: Results, conc: int, rep: int) -> None:
    """The plain and the atomic one-row-write drains, back to back (order alternating)."""
    kinds = ("plain", "atomic") if rep % 2 == 0 else ("atomic", "plain")
    for kind in kinds:
        res.add(f"soniq.write_{kind}.1x{conc}", write_drain(soniq, cfg, conc, kind)["rate"])


def measure_rep(cfg, systems: dict[str, System], raw_db: str, res: Results, rep: int) -> None:
    """One repetition. Each soniq and peer row is measured right after the ceiling row it
    is compared with, so that a ratio compares two measurements a few seconds apart
    (the disk's commit latency drifts on a shared machine)."""
    soniq = systems["soniq"]
    peers = [systems[name] for name in PEERS if name in systems]

    def fresh_raw(rows: int = 0) -> None:
        raw.reset_raw(raw_db)
        if rows:
            raw.copy_rows(raw_db, rows)
        quiesce(raw_db)

    if cfg.only == "drain":  # the drain race alone
        drain_race.measure(cfg, systems, raw_db, res, fresh_raw, drain, run_workers)
        return
    if cfg.only == "wal":  # WAL bytes per job alone (bench/wal.py)
        wal.measure(cfg, systems, raw_db, res, run_workers)
        return
    if cfg.only == "workflows":  # dependencies and batches against plain jobs
        workflows.measure(cfg, soniq, res, run_workers, rep)
        return
    if cfg.only == "steps":  # what a durable step costs per call
        steps.measure(cfg, soniq, res, rep)
        return
    if cfg.only == "atomic":  # the ceiling, then the plain and atomic write drains
        for conc in cfg.concurrency:
            fresh_raw(cfg.drain_jobs)
            res.add(f"raw.drain.{conc}", raw.raw_drain(raw_db, conc, cfg.window)["rate"])
            measure_writes(cfg, soniq, res, conc, rep)
        return

    def fresh(system: System) -> System:
        system.reset()
        quiesce(system.db)
        return system

    # Producers, one job per transaction: the ceiling, enqueue() and the SQL function
    # interleaved in chunks of 25 calls, so the three see the same disk.
    fresh_raw()
    fresh(soniq)
    for key, rate in enqueue_interleaved(raw_db, soniq.db, cfg.enqueue_jobs).items():
        res.add(key, rate)
    for system in peers:
        res.add(f"{system.name}.enqueue", fresh(system).action("enqueue", cfg.enqueue_jobs)["rate"])
    # Many producers at once: group commit, and what NOTIFY does to it.
    fresh_raw()
    res.add(f"raw.insert.{cfg.producers}", raw.insert_threads(
        raw_db, cfg.producers, cfg.enqueue_jobs * 2))
    fresh(soniq)
    res.add(f"soniq.sqlfn.{cfg.producers}", raw.insert_threads(
        soniq.db, cfg.producers, cfg.enqueue_jobs * 2, raw.SONIQ_ENQUEUE))

    # Bulk.
    fresh_raw()
    res.add("raw.copy", raw.copy_rows(raw_db, cfg.bulk_jobs))
    for system in [soniq, *peers]:
        res.add(f"{system.name}.bulk", fresh(system).action("bulk", cfg.bulk_jobs)["rate"])

    # The claim alone, per call, with and without flow control on its queue.
    fresh(soniq)
    for kind, ms in raw.claim_costs(soniq.db, cfg.claim_calls).items():
        res.add(f"soniq.claim_ms.{kind}", ms)
    # Drains: ceiling, then soniq's SQL protocol alone, the worker, the peers.
    for conc in cfg.concurrency:
        fresh_raw(cfg.drain_jobs)
        res.add(f"raw.drain.{conc}", raw.raw_drain(raw_db, conc, cfg.window)["rate"])
        soniq.reset()
        soniq.preload(cfg.drain_jobs)
        quiesce(soniq.db)
        res.add(f"soniq.protocol.{conc}", raw.protocol_drain(soniq.db, conc, cfg.window)["rate"])
        for kind, limits in FLOW_LIMITS.items():
            # The same drain with flow control on the queue: limits that never bind,
            # so the row is what the lock and the counting cost (docs/operations.md).
            soniq.reset()
            soniq.preload(cfg.drain_jobs)
            with connect(soniq.db) as conn:
                conn.execute("INSERT INTO soniq_queue_settings (queue, concurrency, rate_limit, "
                             "rate_period) VALUES ('default', %s, %s, %s)", limits)
            quiesce(soniq.db)
            res.add(f"soniq.protocol_{kind}.{conc}",
                    raw.protocol_drain(soniq.db, conc, cfg.window)["rate"])
        res.add(f"soniq.drain.1x{conc}", drain(soniq, cfg, conc, 1)["rate"])
        if cfg.what_if and conc in cfg.what_if_concurrency:
            # The same worker with persistent connections (no reconnect after each job).
            res.add(f"soniq.drain_persistent.1x{conc}", drain(
                soniq, cfg, conc, 1, env={"BENCH_CONN_MAX_AGE": "none"})["rate"])
        for system in peers:
            res.add(f"{system.name}.drain.1x{conc}", drain(system, cfg, conc, 1)["rate"])
        measure_writes(cfg, soniq, res, conc, rep)  # after the peers: theirs stay near the ceiling
    drain_race.measure(cfg, systems, raw_db, res, fresh_raw, drain, run_workers)
    for conc in cfg.concurrency:
        conns = 2 * conc
        if conns not in cfg.concurrency:
            fresh_raw(cfg.drain_jobs)
            res.add(f"raw.drain.{conns}", raw.raw_drain(raw_db, conns, cfg.window)["rate"])
        res.add(f"soniq.drain.2x{conc}", drain(soniq, cfg, conc, 2)["rate"])

    # WAL bytes per job over a job's life (deterministic enough on a busy machine).
    wal.measure(cfg, systems, raw_db, res, run_workers)
    # What a dependency and a batch cost per job, against plain jobs.
    workflows.measure(cfg, soniq, res, run_workers, rep)
    # What a durable step costs per call, plain and atomic.
    steps.measure(cfg, soniq, res, rep)

    # Latency on an idle worker (the peers' in the first repetition only).
    for system in [soniq, *(peers if cfg.peer_latency and rep == 0 else [])]:
        found = latency(system, cfg)
        res.add(f"{system.name}.latency.p50", found["p50"])
        res.add(f"{system.name}.latency.p99", found["p99"])
        res.add(f"{system.name}.latency.p50_call", found["p50_call"])


def measure_rss(cfg, soniq: System, res: Results) -> None:
    found = drain(soniq, cfg, cfg.rss_concurrency, 1, jobs=cfg.rss_jobs, window=0, rss=True)
    res.add("soniq.rss.peak_mb", found["peak_kb"] / 1024)
    res.add("soniq.rss.first_q_mb", found["first_q_kb"] / 1024)
    res.add("soniq.rss.last_q_mb", found["last_q_kb"] / 1024)
    res.add("soniq.rss.growth_pct", found["growth"] * 100)
    res.add("soniq.rss.drain_rate", found["rate"])


# The table --------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def render(cfg, res: Results, header: str) -> str:
    lines: list[str] = [header]
    widths = (46, 11, 21, 24, 22)

    def row(label, key, unit="jobs/s", ratio="", target="", digits=0):
        values = res.values.get(key, [])
        if cfg.only and not values:
            return  # a row --only left out
        if values:
            s = summary(values)
            med = _fmt(s["median"], digits)
            spread = f"{_fmt(s['min'], digits)}–{_fmt(s['max'], digits)}"
        else:
            med, spread = "-", "-"
        lines.append(f"  {label:<{widths[0]}}{med:>{widths[1]}} {spread:>{widths[2]}} "
                     f"{unit:<7} {ratio:<{widths[3]}} {target}")

    def ratio(num_key, den_key, what):
        """Median of the per-repetition ratios (each pair measured back to back)."""
        nums, dens = res.values.get(num_key), res.values.get(den_key)
        if not nums or not dens:
            return None, ""
        if len(nums) == len(dens):
            value = statistics.median(n / d for n, d in zip(nums, dens))
        else:
            value = statistics.median(nums) / statistics.median(dens)
        return value, f"{value:.2f}× {what}"

    def verdict(value, goal, higher=True):
        if value is None:
            return ""
        met = value >= goal if higher else value <= goal
        return "met" if met else "MISSED"

    def best_peer(kind: str, conf: str = ""):
        best = None
        for peer in PEERS:
            key = f"{peer}.{kind}{conf}"
            value = res.median(key)
            if value is not None and (best is None or value > best[1]):
                best = (peer, value, key)
        return best

    lines.append(f"  {'row':<{widths[0]}}{'median':>{widths[1]}} {'min–max':>{widths[2]}} "
                 f"{'unit':<7} {'ratio':<{widths[3]}} target")
    lines.append("RAW-SQL CEILING (psycopg, prepared, autocommit)")
    row("INSERT 1 row/txn, 1 conn", "raw.insert")
    row(f"INSERT 1 row/txn, {cfg.producers} conns", f"raw.insert.{cfg.producers}")
    row(f"COPY {cfg.bulk_jobs:,} rows in 1 txn", "raw.copy")
    for conns in cfg.raw_connections:
        row(f"claim (SKIP LOCKED) + complete, {conns} conn", f"raw.drain.{conns}")

    lines.append("SONIQ_DJANGO")
    value, text = ratio("soniq.enqueue", "raw.insert", "raw INSERT")
    row("enqueue(), 1 job/txn (autocommit)", "soniq.enqueue", ratio=text,
        target=f"≥0.85× raw: {verdict(value, 0.85)}")
    value, text = ratio("soniq.sqlfn", "raw.insert", "raw INSERT")
    row("SELECT soniq_enqueue() via psycopg, 1/txn", "soniq.sqlfn", ratio=text)
    value, text = ratio(f"soniq.sqlfn.{cfg.producers}", f"raw.insert.{cfg.producers}",
                        f"raw INSERT@{cfg.producers}")
    row(f"SELECT soniq_enqueue(), {cfg.producers} producer conns", f"soniq.sqlfn.{cfg.producers}",
        ratio=text)
    value, text = ratio("soniq.bulk", "raw.copy", "raw COPY")
    row(f"bulk_enqueue() of {cfg.bulk_jobs:,}", "soniq.bulk", ratio=text,
        target=f"≥0.60× raw COPY: {verdict(value, 0.6)}")
    for conns in cfg.concurrency:
        value, text = ratio(f"soniq.protocol.{conns}", f"raw.drain.{conns}", "raw")
        row(f"claim+complete SQL fns, {conns} conn (no worker)", f"soniq.protocol.{conns}",
            ratio=text)
    for kind, label in (("none", "no limit"), ("limited", "concurrency limit"),
                        ("rated", "rate limit")):
        key = f"soniq.claim_ms.{kind}"
        text = "" if kind == "none" else ratio(key, "soniq.claim_ms.none", "no limit")[1]
        row(f"soniq_claim() alone, {label} (sync commit off, median)", key, unit="ms",
            digits=3, ratio=text)
    for kind, label in (("limited", "concurrency limit"), ("rated", "rate limit")):
        for conns in cfg.concurrency:
            key = f"soniq.protocol_{kind}.{conns}"
            if key in res.values:
                row(f"  same, queue with a {label}, {conns} conn", key,
                    ratio=ratio(key, f"soniq.protocol.{conns}", "no limit")[1])
    for processes in (1, 2):
        for conc in cfg.concurrency:
            conns = processes * conc
            key = f"soniq.drain.{processes}x{conc}"
            if f"raw.drain.{conns}" in res.values:
                value, text = ratio(key, f"raw.drain.{conns}", f"raw@{conns}")
                target = f"≥0.60× raw: {verdict(value, 0.6)}"
            else:
                text, target = "", ""
            row(f"soniq_worker --burst, {processes} proc × conc {conc}", key, ratio=text,
                target=target)
    for conc in cfg.concurrency:
        key = f"soniq.drain_persistent.1x{conc}"
        if key in res.values:
            value, text = ratio(key, f"raw.drain.{conc}", f"raw@{conc}")
            row(f"  what-if CONN_MAX_AGE=None, 1 proc × conc {conc}", key, ratio=text)
    for conc in cfg.concurrency:  # the price of atomic=True, with a one-row write in each
        plain, atomic = f"soniq.write_plain.1x{conc}", f"soniq.write_atomic.1x{conc}"
        if plain in res.values:
            row(f"1-row write, plain job, 1 proc × conc {conc}", plain,
                ratio=ratio(plain, f"raw.drain.{conc}", f"raw@{conc}")[1])
        if atomic in res.values:
            price = ratio(atomic, plain, "plain")[1]
            each = [a / p for a, p in zip(res.values[atomic], res.values.get(plain, []))]
            if price and len(each) > 1 and len(each) == len(res.values[atomic]):
                price += f" ({min(each):.2f}–{max(each):.2f})"  # the per-repetition spread
            row(f"1-row write, atomic job, 1 proc × conc {conc}", atomic,
                ratio=ratio(atomic, f"raw.drain.{conc}", f"raw@{conc}")[1],
                target=f"price: {price}" if price else "")
    drain_race.render(cfg, res, lines, row, verdict)
    wal.render(cfg, res, lines, row)
    workflows.render(cfg, res, lines, row, ratio, verdict)
    steps.render(cfg, res, lines, row)
    if cfg.only:
        return "\n".join(lines)
    row("latency enqueue→start p50 (idle worker)", "soniq.latency.p50", unit="ms",
        target=f"≤5 ms: {verdict(res.median('soniq.latency.p50'), 5, higher=False)}", digits=1)
    row("latency enqueue→start p99", "soniq.latency.p99", unit="ms",
        target=f"≤25 ms: {verdict(res.median('soniq.latency.p99'), 25, higher=False)}",
        digits=1)
    row("  (p50 from before the enqueue call)", "soniq.latency.p50_call", unit="ms", digits=1)
    row(f"worker RSS peak, {cfg.rss_jobs:,} jobs, conc {cfg.rss_concurrency}",
        "soniq.rss.peak_mb", unit="MB", digits=1)
    row("worker RSS first-quarter median", "soniq.rss.first_q_mb", unit="MB", digits=1)
    row("worker RSS last-quarter median", "soniq.rss.last_q_mb", unit="MB", digits=1)
    row("worker RSS growth over the drain", "soniq.rss.growth_pct", unit="%",
        target=f"≤10 %: {verdict(res.median('soniq.rss.growth_pct'), 10, higher=False)}",
        digits=1)

    lines.append("PEERS (same workloads; configuration in docs/performance.md)")
    for peer in PEERS:
        if f"{peer}.enqueue" not in res.values:
            continue
        row(f"{peer}: enqueue, 1 job/txn", f"{peer}.enqueue",
            ratio=ratio(f"{peer}.enqueue", "raw.insert", "raw INSERT")[1])
        row(f"{peer}: bulk of {cfg.bulk_jobs:,}"
            + (" (loop, 1 txn)" if peer == "django-tasks-db" else ""), f"{peer}.bulk")
        for conc in cfg.concurrency:
            row(f"{peer}: drain, conc {conc}", f"{peer}.drain.1x{conc}",
                ratio=ratio(f"{peer}.drain.1x{conc}", f"raw.drain.{conc}", f"raw@{conc}")[1])
        if f"{peer}.latency.p50" in res.values:
            row(f"{peer}: latency p50 / p99", f"{peer}.latency.p50", unit="ms", digits=1,
                ratio=f"p99 {_fmt(res.median(f'{peer}.latency.p99'), 1)} ms")

    lines.append("SONIQ ÷ BEST PEER")
    for kind, label in (("enqueue", "enqueue, 1 job/txn"), ("bulk", "bulk enqueue")):
        best = best_peer(kind)
        mine = res.median(f"soniq.{kind}")
        if best and mine:
            lines.append(f"  {label:<{widths[0]}}{mine / best[1]:>10.2f}×  vs {best[0]}")
    for conc in cfg.concurrency:
        best = best_peer("drain.1x", str(conc))
        mine = res.median(f"soniq.drain.1x{conc}")
        if best and mine:
            value = mine / best[1]
            lines.append(f"  {'drain, 1 proc × conc ' + str(conc):<{widths[0]}}{value:>10.2f}×  "
                         f"vs {best[0]:<16} target ≥2×: {verdict(value, 2)}")
    return "\n".join(lines)


# Main -------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="smaller N, one repetition (make bench-quick)")
    parser.add_argument("--reps", type=int, help="repetitions (default 3; quick 1)")
    parser.add_argument("--drain-jobs", type=int, help="jobs queued per drain (default 10000)")
    parser.add_argument("--window", type=float,
                        help="seconds a drain is measured at most (default 4; quick 1.5)")
    parser.add_argument("--full-drain", action="store_true",
                        help="drain every queued job in every configuration (slow)")
    parser.add_argument("--enqueue-jobs", type=int, help="jobs per enqueue loop (default 500)")
    parser.add_argument("--bulk-jobs", type=int, help="jobs per bulk enqueue (default 10000)")
    parser.add_argument("--latency-jobs", type=int, help="jobs per latency run (default 200)")
    parser.add_argument("--no-peer-latency", dest="peer_latency", action="store_false",
                        help="skip the peers' enqueue-to-start latency (first repetition only)")
    parser.add_argument("--no-peers", action="store_true", help="soniq and the ceiling only")
    parser.add_argument("--no-what-if", dest="what_if", action="store_false",
                        help="skip the soniq drains with persistent connections")
    parser.add_argument("--soniq-rev", metavar="REV",
                        help="measure soniq_django as committed at REV (e.g. HEAD) instead of "
                             "the working tree")
    parser.add_argument("--only", choices=["atomic", "drain", "wal", "workflows", "steps"],
                        help="measure only these rows and their ceiling (drain: the drain "
                             "race, bench/drain_race.py, with pgqueuer unless --no-peers; "
                             "atomic: plain and "
                             "atomic jobs with a one-row write; no peers, latency or RSS; "
                             "wal: WAL bytes per job, bench/wal.py, with pgqueuer unless "
                             "--no-peers; workflows: plain jobs against dependencies and "
                             "batches, bench/workflows.py, soniq only; steps: a durable "
                             "step's cost per call, bench/steps.py, soniq only)")
    parser.add_argument("--wal-jobs", type=int,
                        help="jobs per phase of the WAL rows (default 2000; quick 500)")
    parser.add_argument("--wal-concurrency", type=int, default=8,
                        help="the WAL rows' drain: worker concurrency, pgqueuer batch size, "
                             "raw connections (default 8)")
    parser.add_argument("--wal-explain", action="store_true",
                        help="also list the WAL of each soniq phase by relation and record")
    parser.add_argument("--wal-lever", action="append", default=[], metavar="NAME",
                        choices=sorted(wal.LEVERS),
                        help="what-if: change soniq's schema after its migrations "
                             "(bench/wal.py LEVERS, decision 0051) to measure a lever not "
                             "taken; repeatable; the header names them")
    parser.add_argument("--steps-calls", type=int,
                        help="calls of each kind of durable step (default 2000; quick 300)")
    parser.add_argument("--profile", type=int, metavar="CONCURRENCY",
                        help="instead of the table: drain once under py-spy and print hotspots")
    cfg = parser.parse_args(argv)
    quick = cfg.quick
    explicit_drain = cfg.drain_jobs
    cfg.reps = cfg.reps or (1 if quick else 3)
    cfg.drain_jobs = cfg.drain_jobs or (2000 if quick else 10_000)
    cfg.window = None if cfg.full_drain else (cfg.window or (1.5 if quick else 4.0))
    cfg.enqueue_jobs = cfg.enqueue_jobs or (150 if quick else 500)
    cfg.bulk_jobs = cfg.bulk_jobs or (2000 if quick else 10_000)
    cfg.latency_jobs = cfg.latency_jobs or (100 if quick else 200)
    cfg.claim_calls = 300 if quick else 2000
    cfg.steps_calls = cfg.steps_calls or (300 if quick else 2000)
    cfg.rss_jobs = 1000 if quick else 10_000
    cfg.rss_concurrency = 8
    cfg.what_if = cfg.what_if and not quick
    cfg.peer_latency = cfg.peer_latency and not quick
    cfg.what_if_concurrency = (1, 8)
    cfg.concurrency = (1, 4, 8)
    cfg.race_concurrency = drain_race.RACE_CONCURRENCY
    cfg.cpu_jobs = 2000 if quick else 10_000  # a full drain, for the worker's CPU per job
    cfg.raw_connections = (1, 2, 4, 8, 16)
    cfg.idle_warmup = 3.0
    cfg.producers = 8
    cfg.profile_jobs = explicit_drain or 1000
    cfg.wal_jobs = cfg.wal_jobs or (500 if quick else 2000)
    cfg.drain_timeout = 1800 if cfg.full_drain else 300
    return cfg


def _header(cfg) -> str:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except Exception:
            return "?"

    with connect("postgres") as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        sync = conn.execute("SHOW synchronous_commit").fetchone()[0]
        fsync = conn.execute("SHOW fsync").fetchone()[0]
    if cfg.soniq_commit:
        source = f"soniq_django at {cfg.soniq_rev} = {cfg.soniq_commit} (snapshot)"
    else:
        dirty = " + uncommitted changes" if git("status", "--porcelain", "soniq_django") else ""
        head = git("rev-parse", "--short", "HEAD")
        source = f"soniq_django from the working tree (HEAD {head}{dirty})"
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    drain = (f"full drains of {cfg.drain_jobs:,}" if cfg.window is None else
             f"{cfg.drain_jobs:,} queued, measured ≤{cfg.window:g} s or until empty")
    only = f"; only the --only {cfg.only} rows" if cfg.only else ""
    if cfg.wal_lever:
        only += f"; WHAT-IF soniq schema: {', '.join(cfg.wal_lever)} (not soniq_django's)"
    return (f"soniq_django benchmark — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{source}\n"
            f"PostgreSQL {version} (synchronous_commit={sync}, fsync={fsync}), "
            f"{os.cpu_count()} CPUs, load average {load} at the end; "
            f"medians of {cfg.reps} repetition(s), spread min–max; "
            f"drains: {drain}{only}")


def main(argv=None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    if not PEERS_PY.exists() and not cfg.no_peers and cfg.profile is None and (
            cfg.only in (None, "drain", "wal")):
        print("bench: bench/.venv-peers is missing; run `make bench` (it creates it) or "
              "pass --no-peers", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _on_signal)
    pid = os.getpid()
    log_dir = Path(tempfile.mkdtemp(prefix=f"soniq-bench-{pid}-"))
    global SONIQ_SOURCE
    if cfg.soniq_rev:
        cfg.soniq_commit = _snapshot(cfg.soniq_rev, log_dir / "soniq-src")
        SONIQ_SOURCE = str(log_dir / "soniq-src")
        sys.path.insert(0, SONIQ_SOURCE)
    else:
        cfg.soniq_commit = None
    systems = make_systems(pid, log_dir)
    if SONIQ_SOURCE:
        _check_snapshot_is_imported(systems["soniq"])
    if cfg.no_peers or cfg.profile is not None or cfg.only in ("atomic", "workflows", "steps"):
        systems = {"soniq": systems["soniq"]}
    elif cfg.only in ("drain", "wal"):  # the race's (and the WAL rows') one peer
        systems = {name: systems[name] for name in ("soniq", "pgqueuer")}
    raw_db = f"soniq_bench_{pid}_raw"
    created: list[str] = []
    ok = False
    try:
        print(f"bench: databases soniq_bench_{pid}_*, logs in {log_dir}", flush=True)
        for name in [raw_db, *(s.db for s in systems.values())]:
            create_database(name)
            created.append(name)
        soniq = systems["soniq"]
        soniq.action("migrate")
        if cfg.wal_lever:
            wal.apply_levers(soniq.db, cfg.wal_lever)
        # soniq_django also runs in this process (the interleaved enqueue rows).
        os.environ["BENCH_DB_NAME"] = soniq.db
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.soniq_settings"
        import django

        django.setup()
        if cfg.profile is not None:
            from bench.profile import profile_drain

            profile_drain(cfg, soniq, cfg.profile, log_dir)
            ok = True
            return 0
        raw_system = System("raw", PROJECT_PY, "bench.soniq_tasks", "bench.soniq_settings",
                            "", "", "", db=raw_db, log_dir=log_dir)
        raw_system.action("migrate")
        raw.create_raw_table(raw_db)
        for name in PEERS:
            if name in systems:
                systems[name].action("migrate")
        res = Results()
        started = time.perf_counter()
        try:
            for rep in range(cfg.reps):
                print(f"bench: repetition {rep + 1} of {cfg.reps}", flush=True)
                measure_rep(cfg, systems, raw_db, res, rep)
            if not cfg.only:
                print("bench: worker RSS over a full drain", flush=True)
                measure_rss(cfg, soniq, res)
        except Exception:
            if res.values:
                print("\nbench: FAILED; what was measured before the failure:\n")
                print(render(cfg, res, _header(cfg)))
            raise
        print(f"bench: measured in {time.perf_counter() - started:.0f} s\n", flush=True)
        print(render(cfg, res, _header(cfg)))
        ok = True
        return 0
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    finally:
        _stop_children()
        for name in created:
            try:
                drop_database(name)
            except Exception as error:  # keep dropping the others
                print(f"bench: could not drop {name}: {error}", file=sys.stderr)
        if ok:
            shutil.rmtree(log_dir, ignore_errors=True)
        else:
            print(f"bench: worker logs kept in {log_dir}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
