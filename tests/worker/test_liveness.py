"""Bounded waits: no slow call, held lock or lost commit makes a healthy worker run a job twice.

Issue 26, decision 0030. A worker with several running jobs while its
shared connection is held for three leases -- by a call that waits on a
lock (PostgreSQL: an operator's transaction on a limited queue's settings
row), or by a call that simply does not come back (both databases) -- keeps
every lease renewed, the leases of the jobs whose completion waits for the
next round included, and runs each job exactly once. A turn on the shared
connection never outlasts its bound (``bounds.longest_turn()``). An atomic
job's COMMIT lost with its connection leaves a backend idle in the
transaction, holding the job's row: the server ends it within a third of a
lease, the run is failed and runs again, and the worker goes on claiming
meanwhile.
"""

import threading
import time
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.bounds import longest_turn, orphan_limit
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from soniq_django.worker import Worker
from tests.support.commits import release_cut_sockets
from tests.support.workers import FAST, WorkerThread, wait_until
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True)]

LEASE = 2.0
#: Leases, for the tests below: 2 s, beats 0.67 s apart (a third of it).
SHORT = {**FAST, "LEASE_SECONDS": LEASE, "HEARTBEAT_SECONDS": 1, "POLL_INTERVAL": 0.2}
#: Running jobs that must keep their leases (k), and jobs that finish while the
#: connection is held (their completions wait for the next round).
RUNNING, FINISHING = 5, 3


def _server_now():
    """The database's time (SQLite's is this host's, as the worker's claims read it)."""
    if connection.vendor == "sqlite":
        return timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def _lapsed(job_ids) -> list[str]:
    """The jobs among ``job_ids`` still processing whose lease has run out."""
    now = _server_now()
    return [str(row.id) for row in Job.objects.filter(id__in=job_ids, status="processing")
            if row.lease_expires_at is None or row.lease_expires_at <= now]


def _start_jobs(tmp_path, run_log):
    """k cooperative jobs that run on, and jobs that finish when ``go`` appears."""
    go = tmp_path / "go"
    running = [enqueue("tests.worker.cooperative", {"seconds": 60}) for _ in range(RUNNING)]
    finishing = [enqueue("tests.worker.wait_for_file", {"path": str(go)})
                 for _ in range(FINISHING)]
    return go, running, finishing


def _hold_for_three_leases(go, running, finishing) -> list[list[str]]:
    """While the connection is held: let the finishing jobs end, and watch every lease."""
    go.touch()
    seen = []
    deadline = time.monotonic() + 3 * LEASE
    while time.monotonic() < deadline:
        seen.append(_lapsed(running + finishing))
        time.sleep(0.2)
    return [lapsed for lapsed in seen if lapsed]


def _finish(worker_thread, running, finishing, run_log) -> None:
    wait_until(lambda: Job.objects.filter(id__in=finishing, status="done").count() == FINISHING,
               15, "the finished jobs' completions")
    for job_id in running:
        OwnedJobSource().request_cancel(job_id)
    assert worker_thread.stop(20) == 0
    starts = run_log.starts_per_job()
    assert {str(job_id): starts[str(job_id)] for job_id in running + finishing} == {
        str(job_id): 1 for job_id in running + finishing}  # each job ran exactly once
    assert set(Job.objects.filter(id__in=finishing).values_list("status", "attempts")) == {
        ("done", 1)}
    assert set(Job.objects.filter(id__in=running).values_list("status", "attempts")) == {
        ("cancelled", 1)}


def test_a_call_holding_the_shared_connection_for_three_leases_leaves_every_lease_renewed(
        settings, tmp_path, run_log):
    # Whatever holds the worker's connection -- here a call that does not come back for
    # three leases -- the heartbeat renews every lease on a connection of its own: of the
    # k running jobs, and of the jobs whose completion waits for the main loop's next round.
    settings.SONIQ = SHORT
    go, running, finishing = _start_jobs(tmp_path, run_log)
    worker = Worker(concurrency=RUNNING + FINISHING + 2)
    with WorkerThread(worker) as running_worker:
        for job_id in running + finishing:
            run_log.wait_for("start", job_id)
        held, release = threading.Event(), threading.Event()

        def stuck_call():
            with worker.shared.turn():
                held.set()
                release.wait(30)

        holder = threading.Thread(target=stuck_call)
        holder.start()
        try:
            assert held.wait(5)
            lapses = _hold_for_three_leases(go, running, finishing)
        finally:
            release.set()
            holder.join(5)
        assert lapses == []
        _finish(running_worker, running, finishing, run_log)


@contextmanager
def _settings_row_locked(queue: str):
    """An operator's open transaction on ``queue``'s soniq_queue_settings row (docs/operations.md's
    pause from another language, inside BEGIN ... COMMIT), on a connection of its own."""
    with _operator("SELECT * FROM soniq_queue_settings WHERE queue = %s FOR UPDATE", [queue]):
        yield


@contextmanager
def _operator(sql: str, params: list | None = None):
    """An open transaction that ran ``sql``, on a connection of its own, until the block ends."""
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"] or None, port=db["PORT"] or None,
                         user=db["USER"] or None, password=db["PASSWORD"] or None,
                         dbname=db["NAME"], autocommit=False) as operator:
        operator.execute(sql, params or [])
        try:
            yield
        finally:
            operator.rollback()


@pytest.mark.postgresql_only  # row locks; on SQLite every write waits for the one write lock
def test_a_claim_waiting_on_a_queue_settings_lock_runs_no_job_twice(settings, tmp_path,
                                                                     run_log):
    settings.SONIQ = {**SHORT, "QUEUES": {"limited": {"concurrency": 1}}}
    go, running, finishing = _start_jobs(tmp_path, run_log)
    worker = Worker(concurrency=RUNNING + FINISHING + 2)
    turns: list[float] = []
    turn = worker.shared.turn

    @contextmanager
    def timed_turn():
        with turn():
            started = time.monotonic()
            try:
                yield
            finally:
                turns.append(time.monotonic() - started)

    worker.shared.turn = timed_turn  # every call the worker's threads make on it
    with WorkerThread(worker) as running_worker:
        for job_id in running + finishing:
            run_log.wait_for("start", job_id)
        with _settings_row_locked("limited"):
            limited = enqueue("tests.worker.ok", queue="limited")  # each claim waits for it
            turns.clear()
            lapses = _hold_for_three_leases(go, running, finishing)
            longest = max(turns, default=0.0)
        assert lapses == []
        # A claim waited on the lock at most its bound, then gave up (nothing written).
        assert longest <= longest_turn() + 0.5, (longest, longest_turn())
        wait_until(lambda: Job.objects.get(id=limited).status == "done", 10,
                   "the limited queue's job, once the lock is gone")
        _finish(running_worker, running, finishing, run_log)


@pytest.mark.postgresql_only  # a lost COMMIT needs a server on the other end of a connection
def test_an_atomic_commit_lost_in_a_partition_neither_freezes_the_worker_nor_keeps_the_row(
        settings, run_log):
    settings.SONIQ = SHORT
    lost = enqueue("tests.atomic.lost_commit", {"note": "lost"})
    worker = Worker(concurrency=2)
    try:
        with WorkerThread(worker) as running_worker:
            run_log.wait_for("start", lost)
            cut = time.monotonic()
            # The orphan: idle in its transaction, holding the job's row.
            wait_until(lambda: _idle_in_transaction(), 5, "the lost transaction's backend")
            later = [enqueue("tests.worker.ok", {"n": n}) for n in range(3)]
            wait_until(lambda: Job.objects.filter(id__in=later, status="done").count() == 3,
                       3 * LEASE, "jobs enqueued after the lost COMMIT to run meanwhile")
            wait_until(lambda: Job.objects.get(id=lost).status == "done", 3 * LEASE,
                       "the lost run's job to run again and complete")
            recovered = time.monotonic() - cut
            assert running_worker.stop(20) == 0
    finally:
        release_cut_sockets()
    assert recovered < 3 * LEASE  # docs/exactly-once.md: within three leases
    row = Job.objects.get(id=lost)
    assert (row.status, row.attempts) == ("done", 2)
    assert "the commit of this atomic run was lost" in (row.last_error or "")
    # Only the run that committed left its writes.
    assert list(Effect.objects.filter(job_id=lost).values_list("generation", flat=True)) == [2]
    assert [event.attempt for event in run_log.events("start", lost)] == [1, 2]
    assert not _idle_in_transaction()  # ended by the server within orphan_limit()
    assert orphan_limit() < LEASE


def _idle_in_transaction() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND state = 'idle in transaction'")
        return [pid for pid, in cursor.fetchall()]


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True, databases=["default", "server_binding"])
@pytest.mark.parametrize("alias", ["default", "server_binding"])
def test_a_bounded_claim_that_meets_a_held_lock_is_an_answer_and_leaves_no_setting(alias,
                                                                                  settings):
    # The bounds go in the call's own query string (bound on the client too when the
    # connection binds on the server): past them nothing was written, and the session's
    # settings are what they were.
    from django.db import connections

    from soniq_django.errors import ErrorCode, SoniqError
    from soniq_django.owned._store import LOCK_NOT_AVAILABLE

    settings.SONIQ = {**SHORT, "QUEUES": {"limited": {"concurrency": 1}}}
    from soniq_django import flow
    flow.sync_configured("default")
    job_id = enqueue("tests.worker.ok", queue="limited")
    source = OwnedJobSource(alias)
    # Claim protocol v8 no longer waits for a settings row; a lock on the table the claim
    # must lock rows of still makes it wait (a migration's, a LOCK TABLE).
    with _operator("LOCK TABLE soniq_jobs IN EXCLUSIVE MODE"):
        started = time.monotonic()
        with pytest.raises(SoniqError) as raised:
            source.claim_many_owned("w", claim_tokens=["t1", "t2"], lock_wait=0.2)
        waited = time.monotonic() - started
    assert (raised.value.code, raised.value.reason) == (
        ErrorCode.QUEUE_PERSISTENCE_FAILED, LOCK_NOT_AVAILABLE)
    assert 0.2 <= waited < 1.5
    assert Job.objects.get(id=job_id).status == "queued"  # nothing was written
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout'), "
                       "current_setting('statement_timeout')")
        assert cursor.fetchone() == ("0", "0")
    (claimed,) = source.claim_many_owned("w", claim_tokens=["t1"], lock_wait=0.2)  # unused
    assert str(claimed.job_id) == str(job_id)
