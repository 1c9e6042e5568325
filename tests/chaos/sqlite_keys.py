"""The limits-per-key chaos run on SQLite (``python -m tests.chaos.sqlite_keys``, ``make
chaos-keys-sqlite``): what tests/chaos/keys.py proves on PostgreSQL, through the SQLite
twin of the key triggers (sql/sqlite/claim_protocol_v12.sql).

1. A fresh SQLite database file in a temporary directory: migrated, the table
   ``chaos_executions`` added, ``jobs`` ``chaos.keyed`` jobs enqueued over ``keys``
   keys at ``key_concurrency=1`` (tests/chaos/prepare.py's arguments: job n of key
   ``k{n % keys}``, ``max_attempts=50``; a few flaky -- their first attempt fails and
   is retried -- and a few overrunning their ``@job(timeout=...)`` -- failed at the
   deadline while the handler runs on, holding its key's slot).
2. ``workers`` processes of ``manage.py soniq_worker --concurrency N`` on that file,
   with a short lease and fast heartbeats (tests/chaos/sqlite_keyed_jobs.py records
   each run's start and end in ``chaos_executions`` over its own connection).
3. At random points of the drain: ``kills`` SIGKILLs of a random worker (a
   replacement started each time) and ``stops`` SIGSTOPs of a worker with a run
   mid-flight for 1.5 leases, then SIGCONT: its claims and its holds lapse and are
   reaped while it is stopped. SQLite has
   no server: no restarts and no terminated backends (the PostgreSQL run has them).
4. When every job is done, SIGTERM the workers (each must exit 0) and check, with
   ``keys.check_keys``: never two runs of a key at once (from the in-handler stamps
   the attempt history's lapses and ``chaos_hold_ends``' lapsed holds), no key left
   counting, offering or parked;
   every job done, each recorded as run at least once.

``run(SqliteKeysConfig(...))`` returns a ``SqliteKeysOutcome``; the short version is in
the suite (tests/chaos/test_chaos_sqlite_keys_short.py).
"""

import argparse
import dataclasses
import datetime as dt
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .keys import KeyReport, check_keys, specs, summary_lines

ROOT = Path(__file__).resolve().parents[2]

EXECUTIONS_SQL = """
CREATE TABLE chaos_executions (
    exec_id text PRIMARY KEY, job_id char(32) NOT NULL, attempt integer NOT NULL,
    pid integer NOT NULL, started_at text NOT NULL, finished_at text NULL)
"""
# Every soniq_queue_holds row deleted, with its lease then (Django's text times, UTC, as
# the default's): a hold deleted at or past its lease had lapsed, and its key's slot
# went back then (tests/chaos/keys.py, as tests/chaos/schema.py does on PostgreSQL).
HOLD_ENDS_SQL = (
    """
CREATE TABLE chaos_hold_ends (
    job_id char(32) NOT NULL, generation integer NOT NULL, lease_expires_at text NOT NULL,
    at text NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')))
""", """
CREATE TRIGGER chaos_hold_end AFTER DELETE ON soniq_queue_holds FOR EACH ROW BEGIN
    INSERT INTO chaos_hold_ends (job_id, generation, lease_expires_at)
    VALUES (OLD.job_id, OLD.generation, OLD.lease_expires_at);
END
""")


@dataclass(frozen=True)
class SqliteKeysConfig:
    jobs: int = 300
    keys: int = 10
    workers: int = 3
    concurrency: int = 2
    kills: int = 3
    stops: int = 1
    lease: float = 2.0
    heartbeat: float = 0.5
    poll: float = 0.05
    retry_base: float = 0.2
    retry_max: float = 1.0
    job_seconds: tuple = (0.02, 0.15)
    flaky_fraction: float = 0.05
    timeout_fraction: float = 0.05
    window: tuple = (0.1, 0.8)   # the events happen between these fractions of the drain
    drain_timeout: float = 300.0
    stall_timeout: float = 60.0
    seed: int | None = None
    log_dir: Path | None = None


@dataclass
class SqliteKeysOutcome:
    seed: int
    jobs: int
    done: int = 0
    not_done: list[str] = field(default_factory=list)
    never_ran: int = 0
    kills: int = 0
    stops: int = 0
    lapsed_attempts: int = 0
    retried_attempts: int = 0
    seconds: float = 0.0
    keys: KeyReport = field(default_factory=KeyReport)
    problems: list[str] = field(default_factory=list)
    log_dir: Path | None = None

    @property
    def ok(self) -> bool:
        return (not self.problems and not self.not_done and self.never_ran == 0
                and self.done == self.jobs and self.keys.ok)

    def failures(self) -> list[str]:
        return [*self.problems, *self.not_done, *self.keys.violations,
                *([f"{self.never_ran} jobs with no recorded run"] if self.never_ran else [])]

    def summary(self) -> str:
        return "\n".join([
            f"SQLite keys chaos run (seed {self.seed}): {'OK' if self.ok else 'FAILED'}",
            f"  jobs:                    {self.done}/{self.jobs} done in {self.seconds:.1f} s; "
            f"{self.kills} SIGKILLs, {self.stops} SIGSTOPs past the lease; "
            f"{self.lapsed_attempts} attempts lapsed, {self.retried_attempts} failed and retried",
            *summary_lines(self.keys),
        ])


def when(value):
    """A time as stored on SQLite (Django's text, or the handler's stamp) as a datetime."""
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value).replace("T", " ").rstrip("Z"))


class _Workers:
    def __init__(self, config: SqliteKeysConfig, path: Path, log_dir: Path):
        self.config, self.path, self.log_dir = config, path, log_dir
        self.procs: list[subprocess.Popen] = []
        self.dead: set[int] = set()
        self.problems: list[str] = []

    def env(self) -> dict:
        c = self.config
        env = {k: v for k, v in os.environ.items() if not k.startswith("SONIQ_")}
        env.update({
            "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
            "SONIQ_WORKER_DATABASE_URL": f"sqlite:///{self.path}",
            "SONIQ_CHAOS_SQLITE_PATH": str(self.path),
            "PYTHONUNBUFFERED": "1",
            "SONIQ_LEASE_SECONDS": json.dumps(c.lease),
            "SONIQ_HEARTBEAT_SECONDS": json.dumps(c.heartbeat),
            "SONIQ_POLL_INTERVAL": json.dumps(c.poll),
            "SONIQ_RETRY_BASE_SECONDS": json.dumps(c.retry_base),
            "SONIQ_RETRY_MAX_SECONDS": json.dumps(c.retry_max),
            "SONIQ_RESULT_TTL": json.dumps(7 * 86400),  # housekeeping must not purge the proof
            "SONIQ_IMPORTS": json.dumps(["tests.chaos.sqlite_keyed_jobs"]),
        })
        return env

    def wait_registered(self, proc: subprocess.Popen, timeout: float = 60.0) -> None:
        """Return once ``proc`` has its soniq_workers row (its signal handlers are set)."""
        deadline = time.monotonic() + timeout
        conn = sqlite3.connect(self.path, timeout=20, isolation_level=None)
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                if conn.execute("SELECT 1 FROM soniq_workers WHERE pid = ?",
                                (proc.pid,)).fetchone():
                    return
                time.sleep(0.05)
        finally:
            conn.close()
        if proc.poll() is None:
            self.problems.append(f"worker pid {proc.pid} did not register within {timeout} s")

    def start(self) -> subprocess.Popen:
        index = len(self.procs)
        with open(self.log_dir / f"worker-{index}.log", "wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "soniq_worker",
                 "--concurrency", str(self.config.concurrency)],
                cwd=ROOT, env=self.env(), stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        return proc

    def live(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.pid not in self.dead and p.poll() is None]

    def check_health(self) -> None:
        for index, proc in enumerate(self.procs):
            if proc.pid in self.dead or proc.poll() is None:
                continue
            self.dead.add(proc.pid)
            self.problems.append(f"worker {index} (pid {proc.pid}) exited by itself with "
                                 f"{proc.returncode}: {self.tail(index)}")
            self.wait_registered(self.start())

    def tail(self, index: int) -> str:
        try:
            return (self.log_dir / f"worker-{index}.log").read_text(errors="replace")[-1500:]
        except OSError:
            return ""

    def kill(self, rng: random.Random) -> bool:
        live = self.live()
        if not live:
            return False
        victim = rng.choice(live)
        self.dead.add(victim.pid)
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        self.wait_registered(self.start())
        return True

    def stop_past_the_lease(self, rng: random.Random) -> bool:
        """SIGSTOP a worker with a run mid-flight for 1.5 leases, then SIGCONT.

        A timed-out handler's hold it keeps lapses meanwhile and gives its key's slot
        back while the handler runs on, as designed (docs/keys.md): the check ends that
        run at its hold's lapse (``chaos_hold_ends``)."""
        conn = sqlite3.connect(self.path, timeout=20, isolation_level=None)
        try:
            owners = "replace(lower({}), '-', '')"
            busy = {pid for (pid,) in conn.execute(
                "SELECT w.pid FROM soniq_workers AS w JOIN soniq_jobs AS j"
                f" ON {owners.format('j.claim_owner')} = {owners.format('w.id')}"
                " WHERE j.status = 'processing'")}
        finally:
            conn.close()
        live = self.live()
        live = [p for p in live if p.pid in busy] or live
        if not live:
            return False
        victim = rng.choice(live)
        os.kill(victim.pid, signal.SIGSTOP)
        time.sleep(self.config.lease * 1.5)
        os.kill(victim.pid, signal.SIGCONT)
        return True

    def stop_all(self) -> None:
        for proc in self.live():
            proc.send_signal(signal.SIGTERM)
        for index, proc in enumerate(self.procs):
            if proc.pid in self.dead:
                continue
            try:
                code = proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                code = "none (killed after 60 s)"
            if code != 0:
                self.problems.append(f"worker {index} (pid {proc.pid}) stopped with {code}: "
                                     f"{self.tail(index)}")

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
                    proc.wait(10)
                except OSError:
                    pass


def _prepare(path: Path, config: SqliteKeysConfig, rng: random.Random, env: dict) -> None:
    spec = Path(path.parent, "spec.json")
    spec.write_text(json.dumps(specs(rng, jobs=config.jobs, keys=config.keys,
                                     job_seconds=config.job_seconds,
                                     flaky_fraction=config.flaky_fraction,
                                     timeout_fraction=config.timeout_fraction)))
    subprocess.run([sys.executable, "manage.py", "migrate", "--verbosity", "0"], cwd=ROOT,
                   env=env, check=True, stdin=subprocess.DEVNULL)
    with sqlite3.connect(path) as conn:
        conn.execute(EXECUTIONS_SQL)
        for statement in HOLD_ENDS_SQL:
            conn.execute(statement)
    code = ("import json, sys, django; django.setup()\n"
            "from django.db import transaction\n"
            "from soniq_django import bulk_enqueue\n"
            "from soniq_django.producer.request import JobRequest\n"
            "specs = json.load(open(sys.argv[1]))\n"
            "with transaction.atomic():\n"
            "    bulk_enqueue([JobRequest('chaos.keyed', a, max_attempts=50,\n"
            "                             concurrency_key=a['key'], key_concurrency=1)\n"
            "                  for a in specs])\n")
    subprocess.run([sys.executable, "-c", code, str(spec)], cwd=ROOT, env=env, check=True,
                   stdin=subprocess.DEVNULL)


def _finished(conn: sqlite3.Connection) -> int:
    return conn.execute(
        "SELECT (SELECT count(*) FROM soniq_jobs WHERE status IN ('done', 'cancelled'))"
        " + (SELECT count(*) FROM soniq_dead_letter_jobs)").fetchone()[0]


def run(config: SqliteKeysConfig, say=print, inspect=None) -> SqliteKeysOutcome:
    """The run (the module's docstring). ``inspect``, if given, is called with the
    database file's path after the check, before the file is deleted."""
    seed = config.seed if config.seed is not None else random.randrange(10**9)
    rng = random.Random(seed)
    outcome = SqliteKeysOutcome(seed=seed, jobs=config.jobs)
    with tempfile.TemporaryDirectory(prefix="soniq-chaos-sqlite-") as scratch:
        path = Path(scratch, "chaos.sqlite3")
        log_dir = config.log_dir or Path(scratch)
        outcome.log_dir = log_dir
        workers = _Workers(config, path, log_dir)
        _prepare(path, config, rng, workers.env())
        say(f"SQLite keys chaos run: {config.jobs} jobs over {config.keys} keys, "
            f"{config.workers} workers x {config.concurrency}, seed {seed}")
        events = (["kill"] * config.kills) + (["stop"] * config.stops)
        rng.shuffle(events)
        marks = sorted(int(config.jobs * rng.uniform(*config.window)) for _ in events)
        started = time.monotonic()
        conn = sqlite3.connect(path, timeout=20, isolation_level=None)
        try:
            for proc in [workers.start() for _ in range(config.workers)]:
                workers.wait_registered(proc)
            deadline = started + config.drain_timeout
            last, since = -1, time.monotonic()
            while True:
                workers.check_health()
                done = _finished(conn)
                if done != last:
                    last, since = done, time.monotonic()
                while events and marks and done >= marks[0] and done < config.jobs:
                    event, mark = events.pop(0), marks.pop(0)
                    if event == "kill" and workers.kill(rng):
                        outcome.kills += 1
                        say(f"  [{done:>4}/{config.jobs}] SIGKILL a worker (mark {mark})")
                    elif event == "stop" and workers.stop_past_the_lease(rng):
                        outcome.stops += 1
                        say(f"  [{done:>4}/{config.jobs}] SIGSTOP a worker for "
                            f"{config.lease * 1.5:.1f} s, then SIGCONT")
                if done >= config.jobs:
                    break
                if time.monotonic() >= deadline:
                    outcome.problems.append(f"not drained within {config.drain_timeout} s")
                    break
                if time.monotonic() - since > config.stall_timeout:
                    outcome.problems.append(f"no progress for {config.stall_timeout} s at "
                                            f"{done}/{config.jobs}")
                    break
                time.sleep(0.1)
            outcome.seconds = time.monotonic() - started
            workers.stop_all()
            outcome.problems += workers.problems
            outcome.done = conn.execute(
                "SELECT count(*) FROM soniq_jobs WHERE status = 'done'").fetchone()[0]
            outcome.not_done = [f"{job_id}: {status}" for job_id, status in conn.execute(
                "SELECT id, status FROM soniq_jobs WHERE status <> 'done' LIMIT 50")]
            outcome.never_ran = conn.execute(
                "SELECT count(*) FROM soniq_jobs AS j WHERE NOT EXISTS "
                "(SELECT 1 FROM chaos_executions AS e WHERE e.job_id = j.id)").fetchone()[0]
            outcome.lapsed_attempts = conn.execute(
                "SELECT count(*) FROM soniq_job_attempts WHERE outcome = 'lapsed'").fetchone()[0]
            outcome.retried_attempts = conn.execute(
                "SELECT count(*) FROM soniq_job_attempts WHERE outcome = 'failed'").fetchone()[0]
            outcome.keys = check_keys(conn, when=when)
            if inspect is not None:
                inspect(path)
            if config.log_dir is None and not outcome.ok:  # keep the logs of a failed run
                kept = Path(tempfile.mkdtemp(prefix="soniq-chaos-sqlite-logs-"))
                for log in Path(scratch).glob("worker-*.log"):
                    (kept / log.name).write_bytes(log.read_bytes())
                outcome.log_dir = kept
        finally:
            conn.close()
            workers.kill_all()
    return outcome


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.sqlite_keys",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, kind in (("jobs", int), ("keys", int), ("workers", int), ("concurrency", int),
                       ("kills", int), ("stops", int), ("lease", float), ("seed", int)):
        parser.add_argument(f"--{name}", type=kind, help="(default: the full run's)")
    parser.add_argument("--keep-logs", metavar="DIR", help="write worker logs here")
    args = parser.parse_args(argv)
    overrides = {name: value for name in ("jobs", "keys", "workers", "concurrency", "kills",
                                          "stops", "lease", "seed")
                 if (value := getattr(args, name)) is not None}
    if args.keep_logs:
        overrides["log_dir"] = Path(args.keep_logs)
        overrides["log_dir"].mkdir(parents=True, exist_ok=True)
    outcome = run(dataclasses.replace(SqliteKeysConfig(), **overrides),
                  say=lambda text: print(text, flush=True))
    print(outcome.summary())
    if not outcome.ok:
        print("\nFAILURES:", file=sys.stderr)
        for line in outcome.failures()[:60]:
            print(f"- {line}", file=sys.stderr)
        print(f"logs: {outcome.log_dir}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
