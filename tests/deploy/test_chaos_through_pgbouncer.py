"""The chaos run with the workers' database behind PgBouncer in transaction mode.

The chaos driver (tests/chaos/driver.py) on its own private PostgreSQL
cluster, with a PgBouncer in front that every worker connection goes
through. Mid-drain a worker is SIGKILLed and PgBouncer itself is restarted
twice: a safe shutdown (SIGINT: running transactions finish first) and a
crash (SIGKILL: every client and server connection is cut). The driver's
monitoring, the preparation step and the handlers' execution records go
straight to the server: the instruments do not pass through what is tested.
The checker's verdict must be: nothing lost, no stale write applied.
"""

import signal
import time

import psycopg
import pytest

from tests.chaos.checker import check
from tests.chaos.cluster import Cluster, ClusterUnavailable
from tests.chaos.driver import Chaos, Config, Outcome
from tests.support.ci import unavailable
from tests.support.pgbouncer import PgBouncer, PgBouncerUnavailable, Pool, Server

# Crash recovery behind PgBouncer: run in the Django 5.2 passes only.
pytestmark = [pytest.mark.postgresql_only, pytest.mark.version_independent]

CONFIG = Config(
    jobs=600, workers=3, concurrency=2, kills=1, fast_restarts=1, immediate_restarts=1,
    job_seconds=(0.01, 0.08), long_fraction=0.02, downtime=(0.3, 1.5), long_outages=0,
    kill_while_down=0.0, window=(0.15, 0.65), drain_timeout=100.0, stall_timeout=40.0,
)


class _Restarts:
    """What the driver takes for its cluster: the server's URL; its restarts are PgBouncer's."""

    def __init__(self, cluster: Cluster, bouncer: PgBouncer):
        self.cluster, self.bouncer = cluster, bouncer

    def url(self) -> str:
        return self.cluster.url()

    def stop(self, mode: str) -> None:
        self.bouncer.stop(signal.SIGINT if mode == "fast" else signal.SIGKILL)

    def start(self) -> None:
        self.bouncer.start()


class _ThroughPgBouncer(Chaos):
    """Workers connect through PgBouncer; preparing and recording go to the server."""

    def __init__(self, config: Config, restarts: _Restarts, log_dir, say):
        super().__init__(config, restarts, log_dir, say)
        self.bouncer = restarts.bouncer
        self.preparing = False

    def _env(self) -> dict:
        env = super()._env()
        env["SONIQ_CHAOS_RECORD_URL"] = self.url
        if not self.preparing:
            env["SONIQ_WORKER_DATABASE_URL"] = self.bouncer.url("chaos")
        return env

    def prepare(self) -> None:
        self.preparing = True
        try:
            super().prepare()
        finally:
            self.preparing = False


def _say(text: str) -> None:
    print(text.replace("PostgreSQL fast shutdown", "PgBouncer safe shutdown (SIGINT)")
          .replace("PostgreSQL immediate shutdown", "PgBouncer killed (SIGKILL)")
          .replace("while PostgreSQL was down", "while PgBouncer was down"))


def _cluster() -> Cluster:
    try:
        return Cluster()  # finds initdb/pg_ctl and the OS user; creates nothing yet
    except ClusterUnavailable as error:
        unavailable(f"the chaos run cannot start its own PostgreSQL cluster: {error}")


def test_kill_and_pgbouncer_restarts_lose_nothing_and_apply_no_stale_write(tmp_path):
    cluster = _cluster()
    started = time.monotonic()
    with cluster:
        try:
            bouncer = PgBouncer(Server("127.0.0.1", cluster.port, "postgres"),
                                [Pool("chaos", cluster.database, "transaction", 8)])
        except PgBouncerUnavailable as error:
            unavailable(f"the deployment tests need PgBouncer: {error}")
        with bouncer:
            chaos = _ThroughPgBouncer(CONFIG, _Restarts(cluster, bouncer), tmp_path, _say)
            try:
                facts = chaos.run()
                with psycopg.connect(cluster.url()) as conn:
                    report = check(conn, restarts=facts.restarts, survivors=chaos.survivors())
            finally:
                chaos.cleanup()
    outcome = Outcome(facts, report)
    _say(outcome.summary())
    print(f"chaos through PgBouncer: {time.monotonic() - started:.1f} s")
    assert outcome.ok, "\n".join(outcome.failures()[:40])
    assert facts.kills == 1 and facts.restarts_fast == 1 and facts.restarts_immediate == 1
    assert report.enqueued == CONFIG.jobs == report.done + report.dead_lettered
    assert report.lost == 0 and report.unfinished == 0
    assert report.stale_writes_applied == 0 and report.double_completions == 0
    assert report.unexplained_duplicates == 0 and report.workers_not_recovered == 0
    assert facts.drained
