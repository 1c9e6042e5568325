"""The liveness scenario: a healthy worker's jobs run once through slow, lost and stalled calls.

``python -m tests.chaos --liveness`` (``make chaos-liveness``), and a short
round of each fault in the suite (tests/chaos/test_chaos_short.py). Issue 26.

On a private cluster (tests/chaos/cluster.py), two ``soniq_worker`` processes:

- worker A serves ``limited`` (a queue with a concurrency limit) and
  ``free``; every one of its connections goes through a TCP proxy
  (tests/support/proxy.py), so a test can lose one connection's COMMIT;
- worker B serves ``free`` only, straight to the server.

Each round puts k long jobs (two leases each; plain ``chaos.work`` and atomic
``chaos.effect`` in turn, both recording every run in ``chaos_executions``,
the atomic ones writing one ``chaos_effects`` row in their transaction) on
worker A, waits until all k run, then injects one fault:

- ``lock``: an operator's transaction holds ``limited``'s
  ``soniq_queue_settings`` row (``SELECT ... FOR UPDATE``) for 3 leases,
  while a due job waits in ``limited``;
- ``commit``: the COMMIT of a running atomic job is lost: the proxy swallows
  it and resets the worker's side, and keeps the server's side open and
  silent, so the backend stays idle in transaction holding the job's row
  (after ``soniq_complete`` locked it) -- the orphan of a partition;
- ``stall``: the backend serving worker A's shared connection (the one that
  last ran a claim) is SIGSTOPped for 2 leases, then SIGCONTed.

During each fault ``flow`` short jobs go into ``free``. The verdict comes from
the database, not from timing luck:

1. every job of the round ends done, within a settle bound after the fault
   (a frozen worker shows as unfinished jobs);
2. every job ran exactly once (one ``chaos_executions`` row), but the job
   whose COMMIT was lost, which may run once more -- and every atomic job has
   exactly one effect row (the lost run's effect rolled back with it);
3. every ``free`` job enqueued during the fault was first run within
   ``flow_bound`` leases of its enqueue (database clock on both sides);
4. the chaos checker (tests/chaos/checker.py) finds nothing lost, no stale
   write applied, no completion twice.

Nothing here waits without a bound: each wait names its bound.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.support.proxy import Proxy

from .checker import check
from .cluster import Cluster
from .driver import ROOT, Db

APP_A, APP_B = "soniq-liveness-a", "soniq-liveness-b"
FAULTS = ("lock", "commit", "stall")

ENQUEUE_SQL = """
WITH e AS (SELECT soniq_enqueue(%(name)s, %(args)s::jsonb, %(queue)s, max_attempts => 50) AS id)
INSERT INTO chaos_enqueued (job_id) SELECT id FROM e RETURNING job_id::text, clock_timestamp()
"""
# The backend of worker A's shared connection: the one whose last statement was a claim, else
# the one that last renewed leases or wrote completions (never LISTEN, never a job's own).
SHARED_SQL = """
SELECT pid FROM pg_stat_activity
 WHERE application_name = %s
   AND (query ~* 'soniq_claim' OR query ~* 'soniq_heartbeat' OR query ~* 'soniq_complete_many')
 ORDER BY query ~* 'soniq_claim' DESC, state_change DESC LIMIT 1
"""


@dataclass
class LivenessConfig:
    lease: float = 2.0
    heartbeat: float | None = None    # default: lease / 3, the ratio of the defaults (30 s, 10 s)
    running: int = 4                  # k: long jobs running on worker A at each fault
    job_leases: float = 2.0           # a long job runs this many leases
    flow: int = 4                     # free-queue jobs enqueued during each fault
    flow_bound: float = 1.5           # leases: each must start within this of its enqueue
    lock_leases: float = 3.0          # (a) the settings row stays locked this long
    stall_leases: float = 2.0         # (c) the shared connection's backend stays stopped
    settle_leases: float = 6.0        # after a fault, the round's jobs finish within this
    rounds: int = 1                   # rounds of each fault
    faults: tuple[str, ...] = FAULTS
    log_dir: Path | None = None


@dataclass
class Round:
    fault: str
    jobs: list[str] = field(default_factory=list)       # every job of the round
    flow: list[str] = field(default_factory=list)       # free jobs enqueued during the fault
    flow_at: list[tuple] = field(default_factory=list)  # ... and when (database clock)
    lost_commit: str | None = None                      # the job whose COMMIT was lost
    injected: bool = False
    settled: bool = False
    unfinished: int = 0                                 # jobs not done at the settle bound
    note: str = ""


@dataclass
class LivenessOutcome:
    rounds: list[Round]
    violations: list[str]
    executions: dict[str, int]
    log_dir: str
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations

    def summary(self) -> str:
        lines = [f"liveness run: {len(self.rounds)} rounds in {self.seconds:.1f} s"]
        for r in self.rounds:
            twice = sum(1 for j in r.jobs if self.executions.get(j, 0) > 1 and j != r.lost_commit)
            lines.append(f"  {r.fault:<7} injected={r.injected} settled={r.settled} "
                         f"jobs={len(r.jobs)} ran-twice={twice} {r.note}")
        lines.append(f"  verdict: {'PASS' if self.ok else 'FAIL'}")
        return "\n".join(lines)


class Liveness:
    def __init__(self, config: LivenessConfig, cluster: Cluster, log_dir: Path, say):
        self.c, self.cluster, self.log_dir, self.say = config, cluster, log_dir, say
        self.url = cluster.url()
        self.db = Db(self.url)
        self.proxy = Proxy("127.0.0.1", cluster.port)
        self.procs: list[subprocess.Popen] = []
        self.n = 0

    # Set-up -----------------------------------------------------------------------

    def _env(self, url: str, app: str) -> dict:
        c = self.c
        env = {k: v for k, v in os.environ.items() if not k.startswith("SONIQ_")}
        env.update({
            "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
            "SONIQ_WORKER_DATABASE_URL": url,
            "SONIQ_CHAOS_RECORD_URL": self.url,  # the instrument does not go through the proxy
            "PYTHONUNBUFFERED": "1",
            "SONIQ_LEASE_SECONDS": json.dumps(c.lease),
            "SONIQ_HEARTBEAT_SECONDS": json.dumps(c.heartbeat or c.lease / 3),
            "SONIQ_POLL_INTERVAL": json.dumps(0.25),
            "SONIQ_RETRY_BASE_SECONDS": json.dumps(0.05),
            "SONIQ_RETRY_MAX_SECONDS": json.dumps(0.5),
            "SONIQ_RESULT_TTL": json.dumps(7 * 86400),
            "SONIQ_IMPORTS": json.dumps(["tests.chaos.effects"]),
            "SONIQ_QUEUES": json.dumps({"limited": {"concurrency": c.running + 1}}),
            "SONIQ_TEST_APPLICATION_NAME": app,
        })
        return env

    def prepare(self) -> None:
        spec = self.log_dir / "none.json"
        spec.write_text("[]")
        result = subprocess.run([sys.executable, "-m", "tests.chaos.prepare", str(spec)],
                                cwd=ROOT, env=self._env(self.url, APP_B), capture_output=True,
                                text=True, timeout=600)  # bound: a migration, 10 min at most
        if result.returncode != 0:
            raise RuntimeError(f"preparing the liveness database failed:\n{result.stderr[-4000:]}")

    def start(self, name: str, url: str, app: str, queues: str, concurrency: int) -> None:
        with open(self.log_dir / f"worker-{name}.log", "wb") as sink:
            self.procs.append(subprocess.Popen(
                [sys.executable, "manage.py", "soniq_worker", "--queues", queues,
                 "--concurrency", str(concurrency), "--grace", "5"],
                cwd=ROOT, env=self._env(url, app), stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True))
        self.wait_for(f"worker {name} registered", 90, lambda: self.db.value(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)))

    def wait_for(self, what: str, bound: float, probe) -> bool:
        deadline = time.monotonic() + bound  # bound: the caller's
        while time.monotonic() < deadline:
            if probe():
                return True
            time.sleep(0.05)
        self.say(f"  .. {what}: not within {bound:.0f} s")
        return False

    # Jobs -------------------------------------------------------------------------

    def enqueue(self, name: str, queue: str, seconds: float, at: list | None = None) -> str:
        self.n += 1
        args = json.dumps({"n": self.n, "seconds": seconds})
        job_id, when = self.db.rows(ENQUEUE_SQL, {"name": name, "args": args,
                                                  "queue": queue})[0]
        if at is not None:
            at.append((job_id, when))
        return str(job_id)

    def started(self, jobs: list[str]) -> int:
        return int(self.db.value("SELECT count(DISTINCT job_id) FROM chaos_executions "
                             "WHERE job_id = ANY(%s::uuid[])", (jobs,)))

    def done(self, jobs: list[str]) -> int:
        return int(self.db.value("SELECT count(*) FROM soniq_jobs WHERE status = 'done' "
                             "AND id = ANY(%s::uuid[])", (jobs,)))

    def enqueue_flow(self, r: Round) -> None:
        for _ in range(self.c.flow):
            r.flow.append(self.enqueue("chaos.work", "free", 0.05, r.flow_at))

    # Faults -----------------------------------------------------------------------

    def fault_lock(self, r: Round) -> None:
        with psycopg.connect(self.url, application_name="soniq-liveness-operator") as operator:
            held = operator.execute("SELECT queue FROM soniq_queue_settings WHERE queue = "
                                    "'limited' FOR UPDATE").fetchone()
            r.injected = held is not None
            r.jobs.append(self.enqueue("chaos.work", "limited", 0.05))  # due, behind the lock
            self.enqueue_flow(r)
            time.sleep(self.c.lock_leases * self.c.lease)  # bound: the fault's length
            operator.rollback()

    def fault_commit(self, r: Round, atomic: list[str]) -> None:
        # The atomic run that ends first: its backend, then that backend's port at the proxy.
        row = self.db.rows(
            "SELECT e.job_id::text, a.client_port FROM chaos_executions AS e "
            "JOIN pg_stat_activity AS a ON a.pid = e.backend_pid "
            "WHERE e.job_id = ANY(%s::uuid[]) AND e.backend_pid IS NOT NULL "
            "ORDER BY e.sleep_until LIMIT 1", (atomic,))
        if not row:
            r.note = "no atomic run found"
            return
        job_id, port = row[0]
        pair = self.proxy.lose_next(port)
        if pair is None:
            r.note = "its connection is not the proxy's"
            return
        # bound: the job's run, plus a lease for its completion
        r.injected = pair.lost.wait((self.c.job_leases + 1) * self.c.lease)
        r.lost_commit = job_id if r.injected else None
        self.enqueue_flow(r)

    def fault_stall(self, r: Round) -> None:
        found: list[int] = []

        def probe() -> bool:
            pid = self.db.value(SHARED_SQL, (APP_A,))
            if pid is not None:
                found.append(pid)
            return pid is not None

        # bound: two leases for worker A's next claim or beat to show its shared connection
        self.wait_for("worker A's shared connection", 2 * self.c.lease, probe)
        pid = found[0] if found else None
        if pid is None:
            r.note = "no shared connection found: " + "; ".join(
                str(q)[:60] for (q,) in self.db.rows(
                    "SELECT query FROM pg_stat_activity WHERE application_name = %s", (APP_A,)))
            return
        os.kill(pid, signal.SIGSTOP)
        r.injected = True
        try:
            self.enqueue_flow(r)
            time.sleep(self.c.stall_leases * self.c.lease)  # bound: the fault's length
        finally:
            os.kill(pid, signal.SIGCONT)

    def round(self, fault: str) -> Round:
        c, r = self.c, Round(fault)
        seconds = c.job_leases * c.lease
        atomic = []
        for i in range(c.running):
            name = "chaos.effect" if i % 2 else "chaos.work"
            job_id = self.enqueue(name, "limited", seconds)
            r.jobs.append(job_id)
            if name == "chaos.effect":
                atomic.append(job_id)
        # bound: a few leases for worker A to take them all (its poll is a quarter second)
        self.wait_for("the long jobs running", 5 * c.lease,
                      lambda: self.started(r.jobs) == len(r.jobs))
        time.sleep(0.3 * c.lease)  # into the runs: each holds its lease, none has ended
        getattr(self, f"fault_{fault}")(*((r, atomic) if fault == "commit" else (r,)))
        r.jobs += r.flow
        # bound: the settle time after the fault (the long jobs had two leases to run)
        r.settled = self.wait_for(f"round {fault} settled", c.settle_leases * c.lease,
                                  lambda: self.done(r.jobs) == len(r.jobs))
        r.unfinished = len(r.jobs) - self.done(r.jobs)
        self.proxy.release_lost()  # an orphan left behind (no fix) ends now
        self.say(f"  {fault}: injected={r.injected} settled={r.settled} {r.note}")
        return r

    # The verdict -------------------------------------------------------------------

    def verdict(self, rounds: list[Round]) -> tuple[list[str], dict[str, int]]:
        c, bad = self.c, []
        executions = dict(self.db.rows(
            "SELECT job_id::text, count(*)::int FROM chaos_executions GROUP BY job_id"))
        effects = dict(self.db.rows(
            "SELECT job_id::text, count(*)::int FROM chaos_effects GROUP BY job_id"))
        names = dict(self.db.rows("SELECT id::text, job_name FROM soniq_jobs"))
        for r in rounds:
            if not r.injected:
                bad.append(f"{r.fault}: the fault could not be injected ({r.note})")
            if not r.settled:
                bad.append(f"{r.fault}: {r.unfinished} of {len(r.jobs)} "
                           f"jobs not done within {c.settle_leases:g} leases of the fault")
            for job_id in r.jobs:
                runs = executions.get(job_id, 0)
                allowed = 2 if job_id == r.lost_commit else 1
                if runs == 0 or runs > allowed:
                    bad.append(f"{r.fault}: job {job_id} ran {runs} times")
                if names.get(job_id) == "chaos.effect" and effects.get(job_id, 0) != 1:
                    bad.append(f"{r.fault}: job {job_id} has {effects.get(job_id, 0)} "
                               "effect rows")
            late = self.db.rows(
                "SELECT count(*) FILTER (WHERE s.first IS NULL), count(*) FILTER (WHERE "
                "s.first - e.at > make_interval(secs => %s)), max(s.first - e.at) FROM "
                "unnest(%s::uuid[], %s::timestamptz[]) AS e(job_id, at) LEFT JOIN (SELECT "
                "job_id, min(started_at) AS first FROM chaos_executions GROUP BY job_id) AS s "
                "USING (job_id)", (c.flow_bound * c.lease, [j for j, _ in r.flow_at],
                                   [at for _, at in r.flow_at]))[0] if r.flow else (0, 0, None)
            if late[0] or late[1]:
                bad.append(f"{r.fault}: {late[0]} of the {len(r.flow)} free jobs enqueued "
                           f"during the fault never ran, {late[1]} started later than "
                           f"{c.flow_bound:g} leases (slowest {late[2]})")
        return bad, executions


def run(config: LivenessConfig, say: Callable[[str], object] = print) -> LivenessOutcome:
    """Every round of every fault on one private cluster, deleted whatever happens."""
    log_dir = config.log_dir or Path(tempfile.mkdtemp(prefix="soniq-liveness-logs."))
    log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with Cluster() as cluster:
        say(f"liveness: private PostgreSQL on 127.0.0.1:{cluster.port}; logs in {log_dir}")
        live = Liveness(config, cluster, log_dir, say)
        try:
            live.prepare()
            live.start("a", f"postgres://postgres@127.0.0.1:{live.proxy.port}/"
                       f"{cluster.database}", APP_A, "limited,free", config.running + 1)
            live.start("b", cluster.url(), APP_B, "free", 2)
            rounds = [live.round(fault) for _ in range(config.rounds) for fault in config.faults]
            # Anything a fault left behind finishes now, so that a second run shows.
            live.proxy.close()
            everything = [j for r in rounds for j in r.jobs]
            live.wait_for("the rest drained", 10 * config.lease,  # bound: ten leases
                          lambda: live.done(everything) == len(everything))
            violations, executions = live.verdict(rounds)
            with psycopg.connect(cluster.url()) as conn:
                report = check(conn)
            violations += [f"checker: {v}" for v in report.violations
                           if "not done" not in v and "unfinished" not in v]
            outcome = LivenessOutcome(rounds, violations, executions, str(log_dir),
                                      time.monotonic() - started)
            if not outcome.ok:
                (log_dir / "server.log").write_text(cluster.log_tail(200_000))
            return outcome
        finally:
            live.proxy.close()
            live.db.close()
            for proc in live.procs:
                proc.send_signal(signal.SIGTERM)
            for proc in live.procs:
                try:
                    proc.wait(30)  # bound: the workers' grace (5 s) and their exit
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
