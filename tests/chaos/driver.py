"""The chaos driver: real workers drain jobs while workers die and PostgreSQL restarts.

1. Start a private PostgreSQL cluster (tests/chaos/cluster.py).
2. Migrate it, add the chaos tables, enqueue the jobs (tests/chaos/prepare.py):
   ``chaos.work`` (tests/chaos/jobs.py), or in the effects scenario
   (``Config.effects``, ``effects_config()``) ``chaos.effect``, the atomic
   job that writes one effect row (tests/chaos/effects.py), or in the
   workflows scenario (``Config.workflows``, ``workflows_config()``)
   ``chaos.work`` jobs in batches with callbacks and a random DAG of
   dependencies (tests/chaos/workflows.py).
3. Start ``workers`` processes of ``manage.py soniq_worker --concurrency N``
   with a short lease, fast heartbeats and short retry backoffs.
4. At random points of the drain (random fractions of the jobs finished,
   plus a random delay), one event each:

   - ``kill``: SIGKILL a random worker and start a replacement;
   - ``fast``/``immediate``: restart PostgreSQL with that shutdown mode and a
     random downtime (sometimes killing a worker while it is down);
   - ``stop``: SIGSTOP a worker while one of its runs is mid-flight (its
     effect row written, its transaction open), keep it stopped for longer
     than its lease, then SIGCONT it: every claim it held has lapsed, so its
     late completions must be refused (and, for atomic jobs, its writes
     rolled back). The claims it held are handed to the checker;
   - ``terminate``: ``pg_terminate_backend`` of one to three worker backends,
     each aimed at a job connection mid-run, at a job connection at the
     moment its handler ends (its completion about to commit), or at any
     backend of a worker (claims, heartbeats, LISTEN).

5. When every job has finished, SIGTERM the workers (each must exit 0), run
   the checker (tests/chaos/checker.py), and always delete the cluster.

``run(Config(...))`` returns the facts and the checker's report;
``python -m tests.chaos`` is the command-line entry point.
"""

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from .checker import Report, check
from .cluster import Cluster
from .steps import StepsReport, check_steps
from .steps import summary_lines as steps_summary
from .keys import KeyReport, check_keys
from .keys import summary_lines as key_lines
from .workflows import WorkflowReport, check_workflows, expected_endings, plan, summary_lines

ROOT = Path(__file__).resolve().parents[2]

#: The application_name of every Django connection of a chaos worker: the backends
#: ``terminate`` may aim at (never the handlers' recording connections, never the driver's).
WORKER_APP_NAME = "soniq-chaos-worker"

# A worker with a run mid-flight: its claim live; in the effects run, its effect row written
# and its sleep not nearly over.
PICK_STOP_SQL = """
SELECT e.worker_id FROM chaos_executions AS e
  JOIN soniq_jobs AS j ON j.id = e.job_id AND j.status = 'processing'
       AND j.claim_generation = e.attempt AND j.claim_owner = e.worker_id
 WHERE e.finished_at IS NULL AND e.worker_id = ANY(%(live)s)
   AND (NOT %(effects)s OR e.effect_at IS NOT NULL
                           AND e.sleep_until > clock_timestamp() + interval '150 ms')
 ORDER BY e.sleep_until DESC NULLS LAST LIMIT 1
"""
# Every claim a (stopped) worker holds, and whether its run had written its effect.
HELD_SQL = """
SELECT j.id::text, j.claim_generation, e.exec_id IS NOT NULL, e.effect_at IS NOT NULL
  FROM soniq_jobs AS j
  LEFT JOIN chaos_executions AS e ON e.job_id = j.id AND e.attempt = j.claim_generation
 WHERE j.status = 'processing' AND j.claim_owner = %s
"""
# A job connection mid-run: its run is sleeping for a while yet.
MID_RUN_SQL = """
SELECT e.backend_pid FROM chaos_executions AS e
 WHERE e.finished_at IS NULL AND e.backend_pid IS NOT NULL
   AND e.sleep_until > clock_timestamp() + interval '50 ms'
 ORDER BY random() LIMIT 1
"""
# A job connection whose handler ends soon: (its backend, when its sleep ends, unix time).
ENDING_SQL = """
SELECT e.backend_pid, extract(epoch FROM e.sleep_until)::float8 FROM chaos_executions AS e
 WHERE e.finished_at IS NULL AND e.backend_pid IS NOT NULL
   AND e.sleep_until BETWEEN clock_timestamp() + interval '30 ms'
                         AND clock_timestamp() + interval '400 ms'
 ORDER BY e.sleep_until LIMIT 1
"""
ANY_BACKEND_SQL = """
SELECT pid FROM pg_stat_activity WHERE application_name = %s AND pid <> pg_backend_pid()
 ORDER BY random() LIMIT 1
"""
TERMINATE_SQL = """
SELECT pg_terminate_backend(pid) FROM pg_stat_activity
 WHERE pid = %s AND application_name = %s
"""


@dataclass
class Config:
    jobs: int = 5000
    workers: int = 4
    concurrency: int = 2
    kills: int = 8
    fast_restarts: int = 3
    immediate_restarts: int = 3
    lease: float = 2.0
    heartbeat: float = 0.5
    poll: float = 0.5
    retry_base: float = 0.05
    retry_max: float = 0.5
    job_seconds: tuple[float, float] = (0.02, 0.25)  # most jobs
    long_seconds: tuple[float, float] = (1.5, 3.5)   # longer than the lease: heartbeats matter
    long_fraction: float = 0.03
    flaky_fraction: float = 0.02                      # fail their first attempt on purpose
    downtime: tuple[float, float] = (0.2, 3.0)        # seconds the database stays down
    long_outages: int = 1                             # restarts that stay down long_downtime:
    long_downtime: tuple[float, float] = (7.0, 9.0)   # past 3 leases, when workers give up
    kill_while_down: float = 0.4                      # chance of an extra kill during a restart
    window: tuple[float, float] = (0.05, 0.75)        # drain fractions where events happen
    drain_timeout: float = 900.0
    stall_timeout: float = 120.0                      # no job finishing for this long: fail
    seed: int | None = None
    log_dir: Path | None = None                       # default: a temporary directory
    # The effects scenario (effects_config()) and its two events, usable in either run.
    effects: bool = False                             # every job is chaos.effect (atomic)
    control: bool = False                             # ... registered without atomic=True
    stops: int = 0                                    # SIGSTOP a worker past its lease, SIGCONT
    stop_leases: tuple[float, float] = (1.75, 2.75)   # how long it stays stopped, in leases
    terminations: int = 0                             # pg_terminate_backend events (1-3 each)
    # The workflows scenario (workflows_config()): ``jobs`` becomes the plan's job count.
    workflows: bool = False
    batches: int = 0                                  # batches with an on_complete callback
    batch_size: int = 200
    dag_jobs: int = 0                                 # jobs with depends_on (chains, fan-in)
    fail_fraction: float = 0.02                       # members/DAG jobs failing every attempt
    # The steps scenario (steps_config()): chaos.steps, five atomic steps per job.
    steps: bool = False
    # The limits-per-key scenario (keys_config()): chaos.keyed over ``keys`` keys.
    keys: int = 0
    timeout_fraction: float = 0.0                     # keyed jobs that overrun their limit


def effects_config(**overrides) -> Config:
    """The full effects run's defaults (``python -m tests.chaos --effects``).

    Every job is the atomic ``chaos.effect`` and sleeps 50-500 ms; to the
    plain run's kills and restarts come three SIGSTOPs past the lease and
    eight rounds of terminated backends.
    """
    values = dict(effects=True, stops=3, terminations=8, job_seconds=(0.05, 0.5),
                  long_fraction=0.0)
    values.update(overrides)
    return Config(**values)


def workflows_config(**overrides) -> Config:
    """The full workflows run's defaults (``python -m tests.chaos --workflows``).

    10 batches of 200 members with a callback each and 1,500 DAG jobs
    (chains, fan-in, jobs after a callback), 2 % of members and DAG jobs
    failing for good (their dependents cancelled down the graph), under the
    effects run's faults: kills, restarts, SIGSTOPs past the lease and
    terminated backends.
    """
    values = dict(workflows=True, batches=10, batch_size=200, dag_jobs=1500, stops=3,
                  terminations=8, job_seconds=(0.02, 0.3), long_fraction=0.01)
    values.update(overrides)
    return Config(**values)


def steps_config(**overrides) -> Config:
    """The full steps run's defaults (``python -m tests.chaos --steps``).

    100 ``chaos.steps`` jobs of five atomic steps (0.1-0.6 s each), 2 % failing
    their first attempt between steps, under the effects run's faults: kills
    (inside and between steps), restarts, SIGSTOPs past the lease and
    terminated backends (mid-step, and at a step's COMMIT).
    """
    values = dict(steps=True, jobs=100, stops=3, terminations=8, kills=6,
                  job_seconds=(0.5, 3.0), long_fraction=0.0)
    values.update(overrides)
    return Config(**values)


def keys_config(**overrides) -> Config:
    """The full limits-per-key run's defaults (``python -m tests.chaos --keys``).

    300 ``chaos.keyed`` jobs over 10 keys at ``key_concurrency=1``, 3 workers of
    concurrency 3, through SIGKILLs, a SIGSTOP past the lease, terminated
    backends and a fast restart; 5 % flaky (retried), 5 % overrunning their
    time limit (failed at the deadline, running on while holding the slot).
    """
    values = dict(keys=10, jobs=300, workers=3, concurrency=3, kills=3, fast_restarts=1,
                  immediate_restarts=0, long_outages=0, stops=1, terminations=3,
                  job_seconds=(0.02, 0.25), long_fraction=0.0, flaky_fraction=0.05,
                  timeout_fraction=0.05, window=(0.1, 0.7))
    values.update(overrides)
    return Config(**values)


@dataclass
class Facts:
    seed: int = 0
    kills: int = 0
    kills_while_down: int = 0
    restarts_fast: int = 0
    restarts_immediate: int = 0
    restarts: list[dict] = field(default_factory=list)
    stops: int = 0
    stops_missed: int = 0        # stop events that found no run mid-flight to stop
    stopped_claims: list[dict] = field(default_factory=list)  # held by a worker while stopped
    terminations: int = 0        # terminate events
    terminated: dict = field(default_factory=lambda: {"mid-run": 0, "at completion": 0,
                                                      "any": 0})
    rolled_back_logged: int = 0  # worker log lines: an atomic run's writes rolled back
    unexpected_exits: list[str] = field(default_factory=list)
    bad_stops: list[str] = field(default_factory=list)
    worker_errors: list[str] = field(default_factory=list)
    drained: bool = False
    writes_refused: int = 0      # final writes the database answered False (stale fence)
    writes_withheld: int = 0     # final writes the worker did not send: it knew the lease was lost
    drain_seconds: float = 0.0
    total_seconds: float = 0.0
    log_dir: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def restarts_total(self) -> int:
        return self.restarts_fast + self.restarts_immediate

    @property
    def backends_terminated(self) -> int:
        return sum(self.terminated.values())


class Db:
    """A monitoring connection that reconnects through restarts."""

    def __init__(self, url: str):
        self.url = url
        self.conn = None

    def value(self, sql: str, params=None, timeout: float = 120.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=3)
                row = self.conn.execute(sql, params).fetchone()
                return None if row is None else row[0]
            except psycopg.Error:
                self.close()
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def rows(self, sql: str, params=None, timeout: float = 120.0) -> list[tuple]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=3)
                return self.conn.execute(sql, params).fetchall()
            except psycopg.Error:
                self.close()
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = None


class Proc:
    """One ``manage.py soniq_worker`` process."""

    def __init__(self, popen: subprocess.Popen, log: Path, index: int):
        self.popen, self.log, self.index = popen, log, index
        self.started = time.time()
        self.ended: float | None = None
        self.worker_id: str | None = None
        self.killed = False

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, chars: int = 2500) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Return once every thread of ``pid`` is stopped (state T in /proc), or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = {Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()[0]
                      for task in os.listdir(f"/proc/{pid}/task")}
        except (OSError, IndexError):
            return
        if states <= {"T", "t"}:
            return
        time.sleep(0.002)


class Chaos:
    def __init__(self, config: Config, cluster: Cluster, log_dir: Path, say):
        self.config = config
        self.cluster = cluster
        self.log_dir = log_dir
        self.say = say
        self.facts = Facts()
        self.facts.seed = config.seed if config.seed is not None else random.randrange(10**9)
        self.rng = random.Random(self.facts.seed)
        self.procs: list[Proc] = []
        self.db = Db(cluster.url())
        self.url = cluster.url()
        self.stalled = False

    # Workers -----------------------------------------------------------------

    def _env(self) -> dict:
        c = self.config
        env = {k: v for k, v in os.environ.items() if not k.startswith("SONIQ_")}
        env.update({
            "DJANGO_SETTINGS_MODULE": "tests.chaos.settings",
            "SONIQ_WORKER_DATABASE_URL": self.url,
            "PYTHONUNBUFFERED": "1",
            "SONIQ_LEASE_SECONDS": json.dumps(c.lease),
            "SONIQ_HEARTBEAT_SECONDS": json.dumps(c.heartbeat),
            "SONIQ_POLL_INTERVAL": json.dumps(c.poll),
            "SONIQ_RETRY_BASE_SECONDS": json.dumps(c.retry_base),
            "SONIQ_RETRY_MAX_SECONDS": json.dumps(c.retry_max),
            "SONIQ_RESULT_TTL": json.dumps(7 * 86400),  # housekeeping must not purge the proof
            "SONIQ_TEST_APPLICATION_NAME": WORKER_APP_NAME,
        })
        if c.keys:
            env["SONIQ_IMPORTS"] = json.dumps(["tests.chaos.keyed_jobs"])
        if c.effects:
            env["SONIQ_IMPORTS"] = json.dumps(["tests.chaos.effects"])
            if c.control:
                env["SONIQ_CHAOS_EFFECTS_CONTROL"] = "1"
        if c.steps:
            env["SONIQ_IMPORTS"] = json.dumps(["tests.chaos.step_jobs"])
            if c.control:
                env["SONIQ_CHAOS_STEPS_CONTROL"] = "1"
        return env

    @property
    def job_name(self) -> str:
        if self.config.steps:
            return "chaos.steps"
        if self.config.keys:
            return "chaos.keyed"
        return "chaos.effect" if self.config.effects else "chaos.work"

    def start_worker(self) -> Proc:
        env = self._env()
        # Both connection modes of Django: per-job connections and persistent ones.
        env["SONIQ_TEST_CONN_MAX_AGE"] = self.rng.choice(["0", "null"])
        index = len(self.procs)
        log = self.log_dir / f"worker-{index}.log"
        with open(log, "wb") as sink:
            popen = subprocess.Popen(
                [sys.executable, "manage.py", "soniq_worker",
                 "--concurrency", str(self.config.concurrency)],
                cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        proc = Proc(popen, log, index)
        self.procs.append(proc)
        return proc

    def wait_registered(self, proc: Proc, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not proc.alive():
                return  # reported by check_health
            worker_id = self.db.value(
                "SELECT id::text FROM soniq_workers WHERE pid = %s "
                "ORDER BY started_at DESC LIMIT 1", (proc.pid,))
            if worker_id:
                proc.worker_id = worker_id
                return
            time.sleep(0.1)
        self.facts.problems.append(f"worker {proc.index} (pid {proc.pid}) did not register "
                                   f"within {timeout} s:\n{proc.tail()}")

    def live(self) -> list[Proc]:
        return [p for p in self.procs if not p.killed and p.ended is None and p.alive()]

    def check_health(self) -> None:
        """A worker that exited without being killed is a failure; replace it to go on."""
        for proc in self.procs:
            if proc.killed or proc.ended is not None or proc.alive():
                continue
            proc.ended = time.time()
            self.facts.unexpected_exits.append(
                f"worker {proc.index} (pid {proc.pid}) exited by itself with "
                f"{proc.popen.returncode}:\n{proc.tail()}")
            self.say(f"  !! worker {proc.index} exited by itself ({proc.popen.returncode})")
            self.wait_registered(self.start_worker())

    def kill_one(self) -> Proc | None:
        candidates = self.live()
        if not candidates:
            return None
        victim = self.rng.choice(candidates)
        victim.killed = True
        victim.popen.send_signal(signal.SIGKILL)
        victim.popen.wait(10)
        victim.ended = time.time()
        self.facts.kills += 1
        return victim

    # Events --------------------------------------------------------------------

    def finished(self) -> int:
        return self.db.value(
            "SELECT (SELECT count(*) FROM soniq_jobs WHERE status IN ('done', 'cancelled'))"
            " + (SELECT count(*) FROM soniq_dead_letter_jobs)")

    def wait_progress(self, target: int, deadline: float) -> int:
        last, since = None, time.monotonic()
        while True:
            self.check_health()
            done = self.finished()
            if done != last:
                last, since = done, time.monotonic()
            if done >= target or time.monotonic() >= deadline:
                return done
            if time.monotonic() - since > self.config.stall_timeout:
                self.stalled = True
                return done
            time.sleep(0.1)

    def event_kill(self, done: int) -> None:
        victim = self.kill_one()
        if victim is None:
            return
        replacement = self.start_worker()
        self.say(f"  [{done:>5}/{self.config.jobs}] SIGKILL worker {victim.index} "
                 f"(pid {victim.pid}); started worker {replacement.index}")
        self.wait_registered(replacement)

    def event_restart(self, mode: str, done: int, long: bool = False) -> None:
        c = self.config
        downtime = self.rng.uniform(*(c.long_downtime if long else c.downtime))
        down = time.time()
        self.db.close()
        self.cluster.stop(mode)
        victim = None
        if self.rng.random() < self.config.kill_while_down:
            victim = self.kill_one()
            if victim is not None:
                self.facts.kills_while_down += 1
        time.sleep(downtime)
        self.cluster.start()
        up = time.time()
        self.facts.restarts.append({"mode": mode, "down": down, "up": up})
        if mode == "fast":
            self.facts.restarts_fast += 1
        else:
            self.facts.restarts_immediate += 1
        note = f"; SIGKILLed worker {victim.index} while down" if victim else ""
        self.say(f"  [{done:>5}/{self.config.jobs}] PostgreSQL {mode} shutdown, down "
                 f"{up - down:.1f} s{note}")
        if victim is not None:
            self.wait_registered(self.start_worker())

    def event_stop(self, done: int) -> None:
        """SIGSTOP a worker with a run mid-flight for longer than its lease, then SIGCONT it."""
        c = self.config
        live = {p.worker_id: p for p in self.live() if p.worker_id}
        victim, deadline = None, time.monotonic() + 15
        while victim is None and live and time.monotonic() < deadline:
            self.check_health()
            picked = self.db.value(PICK_STOP_SQL, {"live": list(live), "effects": c.effects})
            if picked in live and live[picked].alive():
                victim = live[picked]
            else:
                time.sleep(0.02)
        if victim is None:
            self.facts.stops_missed += 1
            self.say(f"  [{done:>5}/{c.jobs}] SIGSTOP: no run mid-flight found in 15 s")
            return
        os.kill(victim.pid, signal.SIGSTOP)
        _wait_stopped(victim.pid)
        held = self.db.rows(HELD_SQL, (victim.worker_id,))
        pause = self.rng.uniform(*c.stop_leases) * c.lease
        time.sleep(pause)
        os.kill(victim.pid, signal.SIGCONT)
        self.facts.stops += 1
        for job_id, generation, started, effect_written in held:
            self.facts.stopped_claims.append({
                "job_id": job_id, "generation": generation, "started": started,
                "effect_written": effect_written, "worker": victim.index})
        mid = sum(1 for row in held if row[3])
        self.say(f"  [{done:>5}/{c.jobs}] SIGSTOP worker {victim.index} (pid {victim.pid}) "
                 f"for {pause:.1f} s holding {len(held)} claims ({mid} mid-run, effect "
                 "written), then SIGCONT")

    def event_terminate(self, done: int) -> None:
        """pg_terminate_backend one to three worker backends, each aimed its own way."""
        c = self.config
        self.facts.terminations += 1
        hits = []
        for index in range(self.rng.randint(1, 3)):
            if index:
                time.sleep(self.rng.uniform(0.0, 0.3))
            aim = self.rng.choices(["mid-run", "at completion", "any"], [4, 3, 3])[0]
            pid = None
            if aim == "mid-run":
                pid = self.db.value(MID_RUN_SQL)
            elif aim == "at completion":
                row = self.db.rows(ENDING_SQL)
                if row:
                    pid, ends = row[0]
                    # Around the end of its sleep: mostly just after, as the completion commits.
                    time.sleep(max(0.0, ends - time.time() + self.rng.uniform(-0.01, 0.03)))
            if pid is None:
                aim = "any"
                pid = self.db.value(ANY_BACKEND_SQL, (WORKER_APP_NAME,))
            if pid is not None and self.db.value(TERMINATE_SQL, (pid, WORKER_APP_NAME)):
                self.facts.terminated[aim] += 1
                hits.append(aim)
        self.say(f"  [{done:>5}/{c.jobs}] pg_terminate_backend: {len(hits)} worker backends "
                 f"({', '.join(hits) or 'none found'})")

    # The run ------------------------------------------------------------------------

    def prepare(self) -> None:
        c = self.config
        if c.workflows:
            drawn = plan(self.rng, batches=c.batches, batch_size=c.batch_size,
                         dag_jobs=c.dag_jobs, job_seconds=c.job_seconds,
                         fail_fraction=c.fail_fraction, flaky_fraction=c.flaky_fraction,
                         long_fraction=c.long_fraction, long_seconds=c.long_seconds)
            self.config = dataclasses.replace(c, jobs=drawn.jobs)
            self._prepare({"workflow": drawn.nodes})
            return
        if c.keys:
            from .keys import specs as keyed_specs

            self._prepare(keyed_specs(self.rng, jobs=c.jobs, keys=c.keys,
                                      job_seconds=c.job_seconds,
                                      flaky_fraction=c.flaky_fraction,
                                      timeout_fraction=c.timeout_fraction))
            return
        specs = []
        for n in range(c.jobs):
            long = self.rng.random() < c.long_fraction
            seconds = self.rng.uniform(*(c.long_seconds if long else c.job_seconds))
            spec = {"n": n, "seconds": round(seconds, 3)}
            if self.rng.random() < c.flaky_fraction:
                spec["fail_first"] = True
            specs.append(spec)
        self._prepare(specs)

    def _prepare(self, specs) -> None:
        spec_path = self.log_dir / "jobs.json"
        spec_path.write_text(json.dumps(specs))
        result = subprocess.run(
            [sys.executable, "-m", "tests.chaos.prepare", str(spec_path), self.job_name],
            cwd=ROOT,
            env=self._env(), capture_output=True, text=True, timeout=600,
        )
        if result.returncode != 0:
            raise RuntimeError(f"preparing the chaos database failed:\n{result.stdout}\n"
                               f"{result.stderr[-4000:]}")

    def run(self) -> Facts:
        c = self.config
        started = time.monotonic()
        self.prepare()
        c = self.config  # the workflows scenario's job count is the plan's
        for _ in range(c.workers):
            self.start_worker()
        for proc in list(self.procs):
            self.wait_registered(proc)

        events = (["kill"] * c.kills + ["fast"] * c.fast_restarts
                  + ["immediate"] * c.immediate_restarts + ["stop"] * c.stops
                  + ["terminate"] * c.terminations)
        self.rng.shuffle(events)
        restarts = [i for i, event in enumerate(events) if event in ("fast", "immediate")]
        long_ones = set(self.rng.sample(restarts, min(c.long_outages, len(restarts))))
        points = sorted(self.rng.uniform(*c.window) for _ in events)
        drain_started = time.monotonic()
        deadline = drain_started + c.drain_timeout
        self.say(f"  draining {c.jobs} {self.job_name} jobs with {c.workers} workers x "
                 f"{c.concurrency}; {len(events)} events planned")
        for index, (event, point) in enumerate(zip(events, points)):
            done = self.wait_progress(int(point * c.jobs), deadline)
            if time.monotonic() >= deadline or self.stalled:
                break
            time.sleep(self.rng.uniform(0, 0.5))
            if event == "kill":
                self.event_kill(done)
                time.sleep(self.rng.uniform(0.2, 1.0))
            elif event == "stop":
                self.event_stop(done)
                time.sleep(self.rng.uniform(0.5, 1.5))
            elif event == "terminate":
                self.event_terminate(done)
                time.sleep(self.rng.uniform(0.2, 0.8))
            else:
                self.event_restart(event, done, long=index in long_ones)
                time.sleep(self.rng.uniform(1.0, 2.5))
        done = self.wait_progress(c.jobs, deadline)
        self.facts.drained = done >= c.jobs
        self.facts.drain_seconds = time.monotonic() - drain_started
        if not self.facts.drained:
            why = (f"nothing finished for {c.stall_timeout} s" if self.stalled
                   else f"the drain took over {c.drain_timeout} s")
            self.facts.problems.append(f"only {done} of {c.jobs} jobs finished: {why}")
        self.stop_all()
        self.facts.total_seconds = time.monotonic() - started
        return self.facts

    def stop_all(self) -> None:
        """SIGTERM every live worker; each must exit 0 within its grace."""
        ending = time.time()
        stopping = self.live()
        for proc in stopping:
            proc.popen.send_signal(signal.SIGTERM)
        for proc in stopping:
            try:
                code = proc.popen.wait(60)
            except subprocess.TimeoutExpired:
                code = None
            proc.ended = ending
            if code != 0:
                self.facts.bad_stops.append(
                    f"worker {proc.index} (pid {proc.pid}) answered SIGTERM with "
                    f"{code}:\n{proc.tail()}")
        for proc in self.procs:
            for line in proc.tail(10**8).splitlines():
                if "worker error while running" in line or "Traceback" in line:
                    self.facts.worker_errors.append(f"worker {proc.index}: {line.strip()}")
                elif "is no longer this worker's" in line:
                    self.facts.writes_refused += 1
                elif "not recorded; the lease was lost" in line:
                    self.facts.writes_withheld += 1
                if "writes were rolled back" in line:
                    self.facts.rolled_back_logged += 1

    def survivors(self) -> dict[str, tuple[float, float]]:
        return {p.worker_id: (p.started, p.ended or time.time())
                for p in self.procs if not p.killed and p.worker_id}

    def cleanup(self) -> None:
        self.db.close()
        for proc in self.procs:
            if proc.alive():
                try:
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped one too (SIGKILL ends it anyway)
                except OSError:
                    pass
                proc.popen.kill()
        for proc in self.procs:
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:
                pass


@dataclass
class Outcome:
    facts: Facts
    report: Report
    workflows: WorkflowReport | None = None
    steps: "StepsReport | None" = None
    keys: "KeyReport | None" = None

    @property
    def ok(self) -> bool:
        f = self.facts
        return ((self.keys is None or self.keys.ok) and self.report.ok
                and not (self.steps and self.steps.violations) and f.drained
                and not f.unexpected_exits and not f.bad_stops
                and not f.worker_errors and not f.problems)

    def failures(self) -> list[str]:
        f = self.facts
        return [*f.problems, *f.unexpected_exits, *f.bad_stops, *f.worker_errors[:20],
                *self.report.violations, *(self.steps.violations if self.steps else []),
                *(self.keys.violations[:20] if self.keys else [])]

    def summary(self) -> str:
        f, r = self.facts, self.report
        lines = [
            f"chaos run (seed {f.seed}): {r.enqueued} jobs drained in {f.drain_seconds:.1f} s "
            f"({f.total_seconds:.1f} s in all)",
            f"  jobs:                    {r.enqueued} enqueued, {r.done} done, "
            f"{r.dead_lettered} dead-lettered, "
            + (f"{r.cancelled} cancelled (a dependency failed), " if self.workflows else "")
            + f"{r.unfinished} unfinished",
            f"  kills:                   {f.kills} SIGKILL ({f.kills_while_down} while "
            "PostgreSQL was down), each replaced",
            f"  restarts:                {f.restarts_total} (fast {f.restarts_fast} / "
            f"immediate {f.restarts_immediate})",
            *self._stop_lines(),
            f"  executions:              {r.executions} recorded; {r.claims} claims, "
            f"{r.claims_never_run} never reached a handler",
            f"  duplicate executions:    {r.duplicate_executions} (after a lease lapse "
            f"{r.reruns_after_lapse}, after a reported failure {r.reruns_after_failure}, "
            f"unexplained {r.unexplained_duplicates}); earlier generation lower in "
            f"{r.duplicates_earlier_generation_lower} of {r.duplicate_executions}",
            f"  leases lapsed:           {r.lease_lapses} (re-queued by the reaper after "
            "their lease ran out)",
            f"  late results discarded:  {r.stale_results_refused} (handler finished after "
            "its claim lapsed; never applied)",
            f"  stale final writes:      {f.writes_refused} sent and refused by the database's "
            f"fence, {f.writes_withheld} withheld by a worker that saw its lease go",
            f"  completions applied:     {r.completions_applied} (jobs completed twice: "
            f"{r.double_completions})",
            *self._effects_lines(),
            *(summary_lines(self.workflows) if self.workflows else []),
            *(steps_summary(self.steps) if self.steps else []),
            *(key_lines(self.keys) if self.keys else []),
            f"  lost = {r.lost}",
            f"  stale writes applied = {r.stale_writes_applied}",
            f"  workers not recovering after a restart: {r.workers_not_recovered}; "
            f"unexpected exits: {len(f.unexpected_exits)}; bad stops: {len(f.bad_stops)}",
            f"  verdict: {'PASS' if self.ok else 'FAIL'}",
        ]
        return "\n".join(lines)

    def _stop_lines(self) -> list[str]:
        f = self.facts
        if not (f.stops or f.stops_missed or f.terminations):
            return []
        return [
            f"  stops:                   {f.stops} SIGSTOP past the lease, then SIGCONT "
            f"({f.stops_missed} found no run to stop); {len(f.stopped_claims)} claims held "
            f"while stopped, {sum(1 for s in f.stopped_claims if s['effect_written'])} of them "
            "mid-run with their effect written",
            f"  terminated backends:     {f.backends_terminated} in {f.terminations} events "
            f"(job connection mid-run {f.terminated['mid-run']}, at its completion "
            f"{f.terminated['at completion']}, any worker backend {f.terminated['any']})",
        ]

    def _effects_lines(self) -> list[str]:
        f, r = self.facts, self.report
        if not r.effects_checked:
            return []
        per_job = ", ".join(f"{count} row{'s' if count != 1 else ''}: {jobs} jobs"
                            for count, jobs in sorted(r.effects_per_job.items()))
        return [
            f"  effects:                 {r.effects_rows} rows for {r.enqueued} jobs "
            f"({per_job}); jobs without exactly one: {r.effects_not_once}",
            f"  effects of refused runs: {r.effects_not_landed} rows of a generation whose "
            f"completion did not land ({r.effects_of_stopped} of a SIGSTOPped claim); "
            f"late completions of stopped claims applied: {r.stopped_completions_applied}",
            f"  effects rolled back:     {r.effects_rolled_back} (written by a run, then "
            f"gone with its transaction; {f.rolled_back_logged} runs logged by their worker as "
            "rolled back)",
            f"  atomic runs failed outside their handler: {r.atomic_failures_reported} "
            "(the transaction could not begin, or its completion or COMMIT failed; "
            "reported by the worker, retried)",
            f"  executions beyond one per job: {r.duplicate_executions} (counted, not a "
            "failure)",
        ]


def run(config: Config, say=print, inspect=None) -> Outcome:
    """One chaos run on a private cluster; the cluster is deleted whatever happens.

    ``inspect(url, outcome)``, if given, runs after the check and before the
    cluster is deleted (the short test uses it to show the checker failing).
    """
    own_logs = config.log_dir is None
    log_dir = Path(tempfile.mkdtemp(prefix="soniq-chaos-logs.")) if own_logs else config.log_dir
    log_dir.mkdir(parents=True, exist_ok=True)
    ok = False
    with Cluster() as cluster:
        say(f"chaos: private PostgreSQL in {cluster.dir} on 127.0.0.1:{cluster.port}; "
            f"logs in {log_dir}")
        chaos = Chaos(config, cluster, log_dir, say)
        try:
            facts = chaos.run()
            facts.log_dir = str(log_dir)
            with psycopg.connect(cluster.url()) as conn:
                expected = expected_endings(conn) if config.workflows else None
                report = check(conn, restarts=facts.restarts, survivors=chaos.survivors(),
                               effects=config.effects, stopped=facts.stopped_claims,
                               expected=expected)
                flows = check_workflows(conn, report) if config.workflows else None
                stepped = check_steps(conn) if config.steps else None
                keyed = check_keys(conn) if config.keys else None
            outcome = Outcome(facts, report, flows, stepped, keyed)
            if inspect is not None:
                inspect(cluster.url(), outcome)
            ok = outcome.ok
            if not ok:
                (log_dir / "server.log").write_text(cluster.log_tail(200_000))
            return outcome
        finally:
            chaos.cleanup()
            if own_logs and ok:
                import shutil

                shutil.rmtree(log_dir, ignore_errors=True)
