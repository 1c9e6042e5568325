"""Real worker processes and the connections they hold (PostgreSQL: pg_stat_activity, a full server).

docs/deployment.md#connections-per-worker gives the formula; the first
test counts a worker's backends against it, by the ``application_name``
its settings give every connection of the process. The second starts
more workers than a private server (tests/chaos/cluster.py) admits, with
a small ``max_connections``: none exits, each says once that it waits,
and every one of them runs jobs once connections free up -- at start and
again after every connection was lost while the server refused new ones.
"""

import signal
import time
import uuid

import psycopg
import pytest
from django.db import connection

from soniq_django import enqueue
from soniq_django.models import Worker as WorkerRow
from tests.chaos.cluster import Cluster, ClusterUnavailable
from tests.support.ci import unavailable
from tests.support.worker_processes import Children
from tests.support.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql_only]

WAITING = "cannot connect to the database"
QUIET = {"HEARTBEAT_SECONDS": 1, "POLL_INTERVAL": 0.2}


def _backends(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                       [name])
        return cursor.fetchone()[0]


def _holds(name: str, expected: int) -> None:
    """The process tagged ``name`` comes to hold ``expected`` backends, and stays there."""
    wait_until(lambda: _backends(name) == expected, 20,
               f"{expected} backends (now {_backends(name)})")
    seen = []
    for _ in range(5):
        time.sleep(0.2)
        seen.append(_backends(name))
    assert seen == [expected] * 5, seen


def _start_tagged(children: Children, *args: str) -> tuple[str, object]:
    name = f"soniq-budget-{uuid.uuid4().hex[:12]}"
    child = children.start("soniq_worker", *args, env={"SONIQ_TEST_APPLICATION_NAME": name},
                           **QUIET)
    wait_until(lambda: WorkerRow.objects.filter(pid=child.pid, status="active").exists()
               or (not child.alive and pytest.fail(child.log()[-3000:])),
               30, "the worker to register")
    return name, child


def test_a_worker_holds_the_connections_the_formula_says(children, run_log):
    # connections = 1 shared + (job threads whose handlers use the database)
    #             + 1 listener (PostgreSQL) + 1 with --with-scheduler
    name, worker = _start_tagged(children, "--concurrency", "4", "--queues", "budget")
    _holds(name, 2)  # idle: the shared connection and the listener

    def run_four(job: str, seconds: float) -> list:
        ids = [enqueue(job, {"seconds": seconds}, queue="budget") for _ in range(4)]
        for job_id in ids:
            run_log.wait_for("start", job_id, timeout=20)
        return ids

    busy = run_four("tests.worker.sleep", 2.0)
    _holds(name, 2)  # four handlers that touch no database: still 2, at concurrency 4
    for job_id in busy:
        run_log.wait_for("end", job_id, timeout=20)

    querying = run_four("tests.worker.touch_db", 2.0)
    _holds(name, 6)  # each job thread whose handler uses the ORM: + 1
    for job_id in querying:
        run_log.wait_for("end", job_id, timeout=20)

    after = run_four("tests.worker.sleep", 0.3)
    for job_id in after:
        run_log.wait_for("end", job_id, timeout=20)
    _holds(name, 2)  # a job thread closes its connection after a job that did not use it

    scheduling, scheduler = _start_tagged(children, "--concurrency", "4", "--queues", "other",
                                          "--with-scheduler")
    _holds(scheduling, 3)  # + the scheduler thread's
    for child in (worker, scheduler):
        child.signal(signal.SIGTERM)
    assert [child.wait(30) for child in (worker, scheduler)] == [0, 0]


# A server that refuses connections ---------------------------------------------------

#: The private server's max_connections: 3 reserved for superusers (the test), 10 for the rest.
MAX_CONNECTIONS = 13
SLOTS = MAX_CONNECTIONS - 3
WORKERS = 4  # each needs 2 (shared + listener): all fit in SLOTS, but not beside the hogs


def _private_cluster() -> Cluster:
    try:
        return Cluster(database="soniq_budget", max_connections=MAX_CONNECTIONS)
    except ClusterUnavailable as error:
        unavailable(f"cannot start a private PostgreSQL cluster: {error}")


def _enqueue(observer, count: int, seconds: float) -> None:
    observer.execute(
        "SELECT soniq_enqueue('tests.worker.sleep', jsonb_build_object('seconds', %s::float)) "
        "FROM generate_series(1, %s)", [seconds, count])


def _prepare(cluster: Cluster, tmp_path) -> Children:
    """A role of the workers' own (not superuser: the test keeps the reserved slots), migrated."""
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as admin:
        admin.execute("CREATE ROLE soniq_app LOGIN")
        admin.execute(f'ALTER DATABASE "{cluster.database}" OWNER TO soniq_app')
    url = f"postgres://soniq_app@127.0.0.1:{cluster.port}/{cluster.database}"
    children = Children(tmp_path, url)
    migrate = children.start("migrate", "--verbosity", "0")
    assert migrate.wait(120) == 0, migrate.log()[-3000:]
    return children


def _all_ran_since(workers, counts: list[int], timeout: float) -> None:
    wait_until(lambda: all(len(w.done_lines()) > n for w, n in zip(workers, counts)), timeout,
               "every worker to run a job: " + str([len(w.done_lines()) for w in workers]))


@pytest.mark.version_independent  # a private server that refuses: Django 5.2 passes only
def test_workers_a_full_server_refuses_wait_and_every_one_runs_jobs_once_it_admits_them(
        tmp_path):
    cluster = _private_cluster()
    with cluster:
        children = _prepare(cluster, tmp_path)
        observer = psycopg.connect(cluster.url(), autocommit=True)  # a superuser: reserved slot
        hogs = [psycopg.connect(cluster.url(), autocommit=True) for _ in range(SLOTS - 1)]
        try:
            _enqueue(observer, 600, 0.2)
            # Full: the observer and the hogs hold every slot a non-superuser may take.
            workers = [children.start("soniq_worker", LEASE_SECONDS=5, **QUIET)
                       for _ in range(WORKERS)]
            wait_until(lambda: all(w.count(WAITING) for w in workers), 60,
                       "every worker to say it waits")
            time.sleep(3)  # several tries each
            assert all(w.alive for w in workers), [w.log()[-2000:] for w in workers]
            assert [w.count(WAITING) for w in workers] == [1] * WORKERS
            assert not any(w.done_lines() for w in workers)

            # Two slots free up: more workers than the server admits.
            for hog in hogs[:2]:
                hog.close()
            wait_until(lambda: any(w.done_lines() for w in workers), 30, "a job to run")
            time.sleep(2)
            running = [bool(w.done_lines()) for w in workers]
            assert 1 <= sum(running) <= 2, running
            assert all(w.alive for w in workers)

            for hog in hogs[2:]:  # every slot free: every worker gets in and runs jobs
                hog.close()
            _all_ran_since(workers, [0] * WORKERS, 60)
            assert [w.count(WAITING) for w in workers] == [1] * WORKERS

            # Later: every connection lost while the server admits none of theirs.
            observer.execute("ALTER ROLE soniq_app CONNECTION LIMIT 0")
            observer.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE usename = 'soniq_app'")
            wait_until(lambda: all(w.count(WAITING) == 2 for w in workers), 60,
                       "every worker to say, once more, that it waits")
            counts = [len(w.done_lines()) for w in workers]
            time.sleep(2)
            assert all(w.alive for w in workers)
            _enqueue(observer, 300, 0.2)
            observer.execute("ALTER ROLE soniq_app CONNECTION LIMIT -1")
            _all_ran_since(workers, counts, 60)
            assert [w.count(WAITING) for w in workers] == [2] * WORKERS

            for worker in workers:
                worker.signal(signal.SIGTERM)
            assert [worker.wait(60) for worker in workers] == [0] * WORKERS
        finally:
            for hog in hogs:
                hog.close()
            observer.close()
            children.kill_all()
