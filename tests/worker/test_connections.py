"""The worker's connections, in this process: one shared for its own calls, none for idle handlers.

soniq_django/worker/connection.py: every call the worker makes for itself
goes through one connection, taken in turns; a job thread holds a
connection only while its handlers use the database; a slow call never
holds up lease renewals; a database that cannot be reached is waited for.
tests/worker/test_connections_processes.py counts real workers' backends.
"""

import gc
import logging
import threading
import time

import pytest
from django.db import connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from soniq_django import enqueue
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from soniq_django.worker import Worker
from soniq_django.worker.connection import connect_patiently
from tests.support.owned import row_locked
from tests.support.workers import FAST, WorkerThread, run_burst, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast")]

WAITING = "cannot connect to the database"
ASIDE = "renewing leases on a second connection"
ROW_LOCKED = "is locked by another transaction"

# One slot: the job thread completes and claims; more: the main thread does.
BOTH_PATHS = pytest.mark.parametrize("concurrency", [1, 3])


def _opened(job_id) -> int:
    """How many connections the job's thread held open as its handler started."""
    return Job.objects.get(id=job_id).result["open"]


@BOTH_PATHS
def test_a_job_thread_holds_no_connection_while_its_handlers_touch_no_database(concurrency):
    # Dead letters and retries are written by the job threads themselves,
    # and with one slot so are completions and claims: on the shared connection.
    for _ in range(concurrency + 1):
        enqueue("tests.worker.permanent", priority=1)
        enqueue("tests.worker.always_fails", max_attempts=1, priority=1)
        enqueue("tests.worker.ok", priority=1)
    probes = [enqueue("tests.worker.open_connections", {"seconds": 0.02}, priority=2)
              for _ in range(2 * concurrency + 2)]
    assert run_burst(concurrency=concurrency) == 0
    assert [_opened(probe) for probe in probes] == [0] * len(probes)


@BOTH_PATHS
def test_every_call_the_worker_makes_for_itself_goes_through_one_connection(settings,
                                                                            tmp_path,
                                                                            concurrency):
    # Beats a second apart: a turn that a loaded machine makes slow must last half a
    # beat before a beat goes aside, on a second connection (the slow-call tests below).
    settings.SONIQ = {**FAST, "HEARTBEAT_SECONDS": 1}
    beaten = tmp_path / "beaten"
    enqueue("tests.worker.wait_for_file", {"path": str(beaten)})  # runs until a lease renewal
    for n in range(4):
        enqueue("tests.worker.ok", {"n": n})
    enqueue("tests.worker.permanent")
    worker = Worker(burst=True, concurrency=concurrency)
    used: set[tuple[int, str]] = set()
    for name in ("claim_many_owned", "complete_many_and_claim_owned", "complete_many_owned",
                 "fail_owned", "heartbeat_many_owned", "get_owned_state"):
        def recording(*args, _method=getattr(worker.source, name), _name=name, **kwargs):
            thread = threading.current_thread().name
            used.add((id(connections[worker.using]), thread.rstrip("_0123456789")))
            if _name == "heartbeat_many_owned":
                beaten.touch()
            return _method(*args, **kwargs)
        setattr(worker.source, name, recording)
    assert WorkerThread(worker).start().join() == 0
    threads = {thread for _, thread in used}
    assert {"test-worker", "soniq-heartbeat"} <= threads and len(threads) >= 3, threads
    assert len({wrapper for wrapper, _ in used}) == 1, used


@BOTH_PATHS
def test_the_unknown_job_rule_reads_on_the_shared_connection(concurrency):
    # A job no handler here knows: whether to defer it (its age, who else knows it) is
    # read in a turn on the shared connection, so the job thread, whose handlers touch
    # no database, still holds none (docs/deployment.md: 2 at any concurrency).
    unknown = [enqueue("tests.rolling.nobody_has_this_handler", priority=1)
               for _ in range(concurrency + 1)]
    probes = [enqueue("tests.worker.open_connections", {"seconds": 0.02}, priority=2)
              for _ in range(2 * concurrency + 2)]
    assert run_burst(concurrency=concurrency) == 0
    assert {Job.objects.get(id=job_id).status for job_id in unknown} == {"queued"}  # deferred
    assert [_opened(probe) for probe in probes] == [0] * len(probes)


def test_a_job_thread_keeps_its_connection_while_its_handlers_use_it(run_log):
    touch = enqueue("tests.worker.touch_db", priority=1)
    probes = [enqueue("tests.worker.open_connections", priority=p) for p in (2, 3)]
    assert run_burst(concurrency=1) == 0
    assert Job.objects.get(id=touch).status == "done"
    # Kept after the job that used it, for the next one; closed after one that did not.
    assert [_opened(probe) for probe in probes] == [1, 0]


@BOTH_PATHS
def test_a_stopped_worker_leaves_none_of_its_job_threads_connections_open(run_log,
                                                                        concurrency):
    # The job threads keep the connection their last handler used, and end with the
    # worker, closing it as they end: a Django connection is a reference cycle, and
    # with the garbage collector off (as between two of its runs) nothing else would.
    for n in range(concurrency):
        enqueue("tests.worker.touch_db")
        enqueue("tests.atomic.effect", {"note": str(n)})
    before = _sessions()
    gc.collect()
    gc.disable()
    try:
        assert run_burst(concurrency=concurrency) == 0
        assert _open_connections_of_other_threads() == []
        # What the server sees (PostgreSQL): none of the worker's sessions is left.
        wait_until(lambda: not _sessions() - before, 5, "the worker's sessions to end")
    finally:
        gc.enable()
    assert Job.objects.filter(status="done").count() == 2 * concurrency


def _open_connections_of_other_threads() -> list[str]:
    """The aliases of the open Django connections that are not this thread's."""
    mine = {id(conn) for conn in connections.all(initialized_only=True)}
    return [wrapper.alias for wrapper in gc.get_objects()
            if isinstance(wrapper, BaseDatabaseWrapper) and id(wrapper) not in mine
            and wrapper.connection is not None]


def _sessions() -> set[int]:
    """The other server sessions on the test database (PostgreSQL; none on SQLite)."""
    if connection.vendor != "postgresql":
        return set()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid()")
        return {pid for pid, in cursor.fetchall()}


def test_a_slow_call_on_the_shared_connection_does_not_hold_up_lease_renewals(settings,
                                                                              caplog):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    settings.SONIQ = {**FAST, "HEARTBEAT_SECONDS": 0.2}
    job_id = enqueue("tests.worker.ok")
    worker = Worker()
    (claimed,) = worker.writes.round([], 1).jobs
    worker.flights.track(claimed)
    before = Job.objects.get(id=job_id).lease_expires_at
    held, release, renewed = threading.Event(), threading.Event(), []

    def slow_call():  # what a call stuck on a lock does: hold the turn
        with worker.shared.turn():
            held.set()
            release.wait(10)

    def heartbeat():
        started = time.monotonic()
        worker.heartbeat.beat_all()
        renewed.append(time.monotonic() - started)
        release.wait(10)
        worker.heartbeat.beat_all()  # back on the shared connection

    holder = threading.Thread(target=slow_call)
    holder.start()
    assert held.wait(5)
    time.sleep(0.05)
    beating = threading.Thread(target=heartbeat, name="soniq-heartbeat")
    beating.start()
    wait_until(lambda: renewed, 5, "the beat to end while the slow call holds the connection")
    after = Job.objects.get(id=job_id).lease_expires_at
    release.set()
    holder.join(5)
    beating.join(5)
    worker.shared.close()
    assert renewed[0] < 1.0, renewed  # half a beat of patience, then a second connection
    assert after > before
    assert caplog.text.count(ASIDE) == 1


@pytest.mark.postgresql_only
def test_a_completion_stuck_on_a_row_lock_leaves_the_other_leases_renewed(settings, tmp_path,
                                                                         run_log, caplog):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    settings.SONIQ = {**FAST, "LEASE_SECONDS": 4, "HEARTBEAT_SECONDS": 0.2}
    go = tmp_path / "go"
    stuck = enqueue("tests.worker.wait_for_file", {"path": str(go)}, priority=1)
    other = enqueue("tests.worker.cooperative", {"seconds": 60}, priority=2)
    with WorkerThread(Worker(concurrency=2)) as running:
        run_log.wait_for("start", other)
        with row_locked(stuck):  # an operator's transaction holding the stuck job's row
            go.touch()  # the stuck job returns; its completion waits for the lock, on our connection
            leases = [Job.objects.get(id=other).lease_expires_at]
            for _ in range(6):
                time.sleep(0.3)
                leases.append(Job.objects.get(id=other).lease_expires_at)
            assert Job.objects.get(id=stuck).status == "processing"  # still waiting for the lock
        wait_until(lambda: Job.objects.get(id=stuck).status == "done", 10,
                   "the stuck completion to go through")
        assert OwnedJobSource().request_cancel(other) is True
        assert running.stop() == 0
    assert (leases[-1] - leases[0]).total_seconds() > 1.0, leases  # renewed all along
    assert Job.objects.get(id=other).attempts == 1
    assert ASIDE in caplog.text


@pytest.mark.postgresql_only  # row locks: SQLite locks the whole database, every write waits
def test_a_lease_renewal_that_meets_a_row_lock_leaves_the_other_leases_renewed(settings, run_log,
                                                                             caplog):
    # An operator's transaction holds a running job's row: that job's renewal
    # waits for it at most a moment, and the other job's lease goes on being renewed.
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    settings.SONIQ = {**FAST, "LEASE_SECONDS": 4, "HEARTBEAT_SECONDS": 0.2}
    held = enqueue("tests.worker.cooperative", {"seconds": 60}, priority=1)
    other = enqueue("tests.worker.cooperative", {"seconds": 60}, priority=2)
    def lease(job_id):
        return Job.objects.get(id=job_id).lease_expires_at

    with WorkerThread(Worker(concurrency=2)) as running:
        run_log.wait_for("start", held)
        run_log.wait_for("start", other)
        with row_locked(held):
            held_then, leases = lease(held), [lease(other)]
            for _ in range(6):
                time.sleep(0.3)
                leases.append(lease(other))
            held_while_locked = lease(held)
        wait_until(lambda: lease(held) > held_while_locked, 10, "the held lease's renewal")
        for job_id in (held, other):
            assert OwnedJobSource().request_cancel(job_id) is True
        assert running.stop() == 0
    assert (leases[-1] - leases[0]).total_seconds() > 1.0, leases  # renewed all along
    assert held_while_locked == held_then  # not renewed while the row was held
    assert Job.objects.get(id=held).attempts == 1 and Job.objects.get(id=other).attempts == 1
    assert caplog.text.count(ROW_LOCKED) == 1  # said once, however many beats it lasted


@pytest.mark.sqlite_only
def test_a_database_that_cannot_be_opened_is_waited_for_and_said_once(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    later = tmp_path / "not-yet"
    wrapper = connection.copy()
    wrapper.settings_dict["NAME"] = str(later / "db.sqlite3")
    appears = threading.Timer(1.0, later.mkdir)
    appears.start()
    started = time.monotonic()
    try:
        connect_patiently(wrapper, threading.Event())
        waited = time.monotonic() - started
        assert wrapper.connection is not None
    finally:
        appears.cancel()
        wrapper.close()
    assert waited >= 1.0
    assert caplog.text.count(WAITING) == 1  # several tries, one line
    assert caplog.text.count("connected to the database after waiting") == 1

    gone = connection.copy()
    gone.settings_dict["NAME"] = str(tmp_path / "never" / "db.sqlite3")
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(SoniqError) as raised:
        connect_patiently(gone, stopped)  # stopping: one try, then the error
    assert raised.value.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
