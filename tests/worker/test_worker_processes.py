"""Real worker processes (``manage.py soniq_worker``) against the test database.

Each child runs with ``tests.worker_settings``: the test database (read from
this process's connection, passed in the environment, never printed), soniq
settings from ``SONIQ_*`` variables, and the test handlers of
tests/testapp/jobs.py, which append one line per event to a shared run log.
Tests use committed rows (``transaction=True``) so the children see them.
Every child is killed at the end of its test, whatever happened.
"""

import json
import signal
import statistics
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from soniq_django import bulk_enqueue, enqueue
from soniq_django.producer.request import JobRequest
from soniq_django.models import DeadLetterJob, Job, Worker as WorkerRow
from soniq_django.owned import OwnedJobSource, QueueClaimFence
from tests.support.owned import rewrite
from tests.support.worker_processes import Child, Children, database_url
from tests.support.workers import RunLog, run_burst, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

class Workers(Children):
    """``soniq_worker`` processes on the test database, writing to the test's run log."""

    def __init__(self, tmp_path: Path, run_log: RunLog):
        super().__init__(tmp_path, database_url(connection),
                         {"SONIQ_TEST_RUN_LOG": str(run_log.path)})
        self.run_log = run_log

    def start(self, *args: str, env: dict | None = None, **soniq) -> Child:
        """Start ``soniq_worker *args`` with ``SONIQ[name] = value`` for each keyword."""
        return self.worker(*args, env=env, **soniq)

    def wait_registered(self, child: Child, timeout: float = 30.0) -> WorkerRow:
        """Wait until the child has its row in soniq_workers (its signal handlers are set)."""
        return wait_until(
            lambda: WorkerRow.objects.filter(pid=child.pid, status="active").first()
            or child.exited(),
            timeout, f"worker {child.pid} to register",
        )


@pytest.fixture
def workers(tmp_path, run_log):
    pool = Workers(tmp_path, run_log)
    try:
        yield pool
    finally:
        pool.cleanup()


def status_counts() -> Counter:
    return Counter(Job.objects.values_list("status", flat=True))


def fence_of(job_id) -> QueueClaimFence:
    """The fence of the job's current claim, read from its row (what its owner holds)."""
    row = Job.objects.get(id=job_id)
    return QueueClaimFence(queue=row.queue, job_id=str(row.id), worker_id=row.claim_owner,
                           generation=row.claim_generation, claim_token=row.claim_token)


def lease_lapsed(job_id) -> bool:
    row = Job.objects.get(id=job_id)
    return row.lease_expires_at is not None and row.lease_expires_at < timezone.now()


# Many jobs, many processes -----------------------------------------------------


@pytest.mark.version_independent  # load or lease recovery after a kill: Django 5.2 passes only
def test_2000_jobs_across_4_worker_processes_each_end_done_exactly_once(workers, run_log):
    total = 2000
    ids = bulk_enqueue([JobRequest("tests.worker.ok", {"n": n}) for n in range(total)])
    started = time.monotonic()
    children = [
        workers.start("--concurrency", "2", "--burst", HEARTBEAT_SECONDS=1, POLL_INTERVAL=0.2)
        for _ in range(4)
    ]
    codes = [child.wait(timeout=170) for child in children]
    elapsed = time.monotonic() - started
    assert codes == [0, 0, 0, 0], [child.log()[-2000:] for child in children]

    # Every job is done, by its first and only claim, with the result of that run.
    assert status_counts() == {"done": total}
    assert not DeadLetterJob.objects.exists()
    rows = {str(r["id"]): r for r in Job.objects.values("id", "attempts", "result",
                                                        "claim_generation")}
    assert set(rows) == {str(job_id) for job_id in ids}
    pids = {child.pid for child in children}
    for job_id, row in rows.items():
        assert (row["attempts"], row["claim_generation"]) == (1, 1), job_id
        assert row["result"]["job"] == job_id and row["result"]["attempt"] == 1
        assert row["result"]["pid"] in pids
    # Each handler ran exactly once (one "start" per job in the shared run log) ...
    starts = run_log.events("start")
    assert len(starts) == total
    assert set(Counter(event.job_id for event in starts).values()) == {1}
    # ... and each job was completed exactly once (one "done" log line across all workers).
    completions = Counter(job_id for child in children for job_id in child.done_lines())
    assert sum(completions.values()) == total
    assert set(completions) == set(rows) and set(completions.values()) == {1}
    # The work was really shared, and every worker stopped cleanly.
    per_worker = Counter(row["result"]["pid"] for row in rows.values())
    assert len(per_worker) >= 2, per_worker
    assert set(WorkerRow.objects.filter(pid__in=pids).values_list("status", flat=True)) == {
        "stopped"
    }
    print(f"\n2000 jobs / 4 workers x 2: {elapsed:.1f} s; jobs per worker: "
          f"{sorted(per_worker.values())}")


# Rolling deploys ---------------------------------------------------------------


def test_old_workers_defer_a_new_handlers_job_and_a_new_worker_runs_it(workers, run_log):
    job_id = enqueue("tests.rolling.added", {"word": "hi"}, max_attempts=1)
    # The previous release: this process has no handler for the name (it is not in
    # any jobs.py); twice, as several old workers would.
    for _ in range(2):
        assert run_burst() == 0
        row = Job.objects.get(id=job_id)
        assert (row.status, row.attempts) == ("queued", 0)
        assert row.scheduled_at > timezone.now()
        rewrite(job_id, scheduled_at=timezone.now())  # due again now, not in a few seconds
    assert not DeadLetterJob.objects.exists()
    # The next release: SONIQ["IMPORTS"] names the module that holds the handler.
    child = workers.start("--burst", IMPORTS=["tests.testapp.rolling"], POLL_INTERVAL=0.2)
    assert child.wait(60) == 0, child.log()[-2000:]
    row = Job.objects.get(id=job_id)
    assert (row.status, row.result, row.attempts, row.claim_generation) == ("done", "HI", 1, 3)


@pytest.mark.version_independent  # load or lease recovery after a kill: Django 5.2 passes only
def test_a_burst_worker_waits_for_a_killed_workers_lease_and_runs_its_job(workers, run_log):
    # A lease long enough to outlast the start of the next process, which must find it held.
    fast = {"LEASE_SECONDS": 8, "HEARTBEAT_SECONDS": 0.2, "POLL_INTERVAL": 0.2}
    job_id = enqueue("tests.worker.sleep", {"seconds": 60, "first_attempt_only": True})
    doomed = workers.start(**fast)
    run_log.wait_for("start", job_id, timeout=30)
    doomed.signal(signal.SIGKILL)
    assert doomed.wait(10) == -signal.SIGKILL
    assert not lease_lapsed(job_id)  # the dead worker's lease still holds the job
    plain = workers.start("--burst", **fast)
    assert plain.wait(30) == 0
    assert plain.log().rstrip().endswith(
        "other workers still hold 1 job(s) of its queues (1 under a lease)")
    assert Job.objects.get(id=job_id).status == "processing"
    waiting = workers.start("--burst", "--wait-for-leases", **fast)
    assert waiting.wait(60) == 0, waiting.log()[-2000:]
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts, row.result["pid"]) == ("done", 2, waiting.pid)
    assert waiting.log().rstrip().endswith(
        "stopped after 1 jobs (1 done); other workers still hold 0 job(s) of its queues "
        "(0 under a lease)")


# Crashes and signals -----------------------------------------------------------


@pytest.mark.version_independent  # load or lease recovery after a kill: Django 5.2 passes only
def test_a_killed_workers_job_is_rerun_after_its_lease_and_its_late_write_is_refused(
    workers, run_log
):
    fast = {"LEASE_SECONDS": 1, "HEARTBEAT_SECONDS": 0.2, "POLL_INTERVAL": 0.2}
    job_id = enqueue("tests.worker.sleep", {"seconds": 60, "first_attempt_only": True})
    doomed = workers.start(**fast)
    (first_run,) = run_log.wait_for("start", job_id, timeout=30)
    assert (first_run.pid, first_run.attempt) == (doomed.pid, 1)
    old_fence = fence_of(job_id)  # what the doomed incarnation holds
    assert Job.objects.get(id=job_id).pid == doomed.pid  # recorded with the claim

    rescuer = workers.start(**fast)
    workers.wait_registered(rescuer)
    doomed.signal(signal.SIGKILL)
    assert doomed.wait(10) == -signal.SIGKILL

    (second_run,) = run_log.wait_for("start", job_id, count=2, timeout=30)[1:]
    assert (second_run.pid, second_run.attempt) == (rescuer.pid, 2)
    wait_until(lambda: Job.objects.get(id=job_id).status == "done", 20, "the re-run to finish")
    row = Job.objects.get(id=job_id)
    assert row.attempts == 2 and row.claim_generation == old_fence.generation + 1
    assert row.result["pid"] == rescuer.pid and row.result["attempt"] == 2

    # The killed incarnation wakes up and reports, with its old fence: refused.
    source = OwnedJobSource()
    assert source.complete_owned(old_fence, {"late": True}) is False
    assert source.fail_owned(old_fence, "late failure", retry=True) is False
    assert source.heartbeat_owned(old_fence) is False
    after = Job.objects.get(id=job_id)
    assert (after.status, after.result, after.attempts) == ("done", row.result, 2)

    rescuer.signal(signal.SIGTERM)
    assert rescuer.wait(30) == 0
    assert len(run_log.events("start", job_id)) == 2


def test_sigterm_lets_the_running_job_finish_claims_nothing_more_and_exits_0(
    workers, run_log
):
    job_id = enqueue("tests.worker.sleep", {"seconds": 2})
    # Two slots: one stays free, so only the stop can keep the worker from claiming.
    child = workers.start("--concurrency", "2", HEARTBEAT_SECONDS=0.2, POLL_INTERVAL=0.2)
    row = workers.wait_registered(child)
    run_log.wait_for("start", job_id, timeout=30)
    child.signal(signal.SIGTERM)
    wait_until(lambda: WorkerRow.objects.get(id=row.id).status == "stopping", 10,
               "the worker to say it is stopping")
    later = [enqueue("tests.worker.ok", {"n": n}) for n in range(3)]
    assert child.wait(30) == 0

    (end,) = run_log.events("end", job_id)
    assert end.pid == child.pid
    finished = Job.objects.get(id=job_id)
    assert finished.status == "done" and finished.result["pid"] == child.pid
    for job_id in later:
        queued = Job.objects.get(id=job_id)
        assert (queued.status, queued.attempts, queued.claim_owner) == ("queued", 0, None)
    assert not run_log.events("start", later[0])
    stopped = WorkerRow.objects.get(id=row.id)
    assert stopped.status == "stopped" and stopped.last_heartbeat >= finished.updated_at


def test_sigterm_just_before_the_slot_frees_claims_none_of_the_waiting_jobs(workers, run_log):
    # One slot, busy; jobs wait behind it. The signal comes 0.2 s before the
    # slot frees, while the claim loop is waiting for that slot.
    job_id = enqueue("tests.worker.sleep", {"seconds": 2}, priority=1)
    waiting = [enqueue("tests.worker.ok", {"n": n}) for n in range(3)]
    child = workers.start(HEARTBEAT_SECONDS=0.2, POLL_INTERVAL=0.2)
    (start,) = run_log.wait_for("start", job_id, timeout=30)
    time.sleep(max(0.0, start.at + 1.8 - time.time()))
    child.signal(signal.SIGTERM)
    assert child.wait(30) == 0
    assert Job.objects.get(id=job_id).status == "done"
    for queued in Job.objects.filter(id__in=waiting):
        assert (queued.status, queued.attempts) == ("queued", 0)
    assert len(run_log.events("start")) == 1


@pytest.mark.version_independent  # lease recovery after an abort: Django 5.2 passes only
@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_second_signal_aborts_and_the_abandoned_job_runs_again_after_its_lease(
    workers, run_log, second
):
    fast = {"LEASE_SECONDS": 1, "HEARTBEAT_SECONDS": 0.2, "POLL_INTERVAL": 0.2}
    job_id = enqueue("tests.worker.sleep", {"seconds": 60, "first_attempt_only": True})
    child = workers.start(**fast)
    row = workers.wait_registered(child)
    run_log.wait_for("start", job_id, timeout=30)
    child.signal(signal.SIGTERM)
    wait_until(lambda: WorkerRow.objects.get(id=row.id).status == "stopping", 10,
               "the worker to say it is stopping")
    child.signal(second)
    code = child.wait(10)  # not the 60 s the job would take, nor the 30 s grace
    assert code != 0

    abandoned = Job.objects.get(id=job_id)
    assert abandoned.status == "processing" and abandoned.claim_owner == str(row.id)
    wait_until(lambda: lease_lapsed(job_id), 10, "the abandoned lease to lapse")
    rescuer = workers.start("--burst", **fast)
    assert rescuer.wait(60) == 0
    done = Job.objects.get(id=job_id)
    assert (done.status, done.attempts) == ("done", 2)
    assert done.result["pid"] == rescuer.pid
    assert [e.attempt for e in run_log.events("start", job_id)] == [1, 2]


# PostgreSQL: restarts and wake-ups -------------------------------------------


def _terminate_other_backends() -> int:
    """pg_terminate_backend every other session of this (private) test database."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


@pytest.mark.postgresql_only
@pytest.mark.parametrize("conn_max_age", [0, None], ids=["per-job-connections", "persistent"])
def test_workers_survive_every_connection_being_killed_and_lose_nothing(
    workers, run_log, conn_max_age
):
    """The in-suite stand-in for a PostgreSQL restart: every session is terminated, 3 times."""
    total = 400
    ids = bulk_enqueue(
        [JobRequest("tests.worker.touch_db", {"seconds": 0.02}) for _ in range(total)]
    )
    children = [
        workers.start("--concurrency", "2", HEARTBEAT_SECONDS=0.5, POLL_INTERVAL=0.2,
                      env={"SONIQ_TEST_CONN_MAX_AGE": json.dumps(conn_max_age)})
        for _ in range(2)
    ]
    for child in children:
        workers.wait_registered(child)
    killed = []
    for threshold in (total // 4, total // 2, 3 * total // 4):
        wait_until(lambda: len(run_log.events("end")) >= threshold, 60,
                   f"{threshold} jobs to have run")
        killed.append(_terminate_other_backends())
    wait_until(lambda: status_counts() == {"done": total}, 90,
               "every job to be done after the restarts")
    assert all(child.process.poll() is None for child in children)  # they rode it out
    for child in children:
        child.signal(signal.SIGTERM)
    assert [child.wait(30) for child in children] == [0, 0]

    # Every round hit at least each worker's claiming and listening sessions,
    # and some round also the job threads' (handlers hold theirs while they sleep).
    assert all(count >= 4 for count in killed) and sum(killed) > 4 * len(killed), killed
    assert not DeadLetterJob.objects.exists()
    rows = {str(r["id"]): r for r in Job.objects.filter(id__in=ids).values("id", "attempts",
                                                                           "result")}
    assert len(rows) == total
    # Completed exactly once each, by the job's last claim ...
    completions = Counter(job_id for child in children for job_id in child.done_lines())
    assert set(completions) == set(rows) and set(completions.values()) == {1}
    for row in rows.values():
        assert row["result"]["attempt"] == row["attempts"], row
    # ... and no claim ran twice. A handler whose own query met a killed
    # session failed that attempt, and only that attempt was retried.
    runs = Counter((event.job_id, event.attempt) for event in run_log.events("start"))
    assert set(runs.values()) == {1}
    assert set(runs) == {(job_id, attempt) for job_id, row in rows.items()
                         for attempt in range(1, row["attempts"] + 1)}
    logs = "".join(child.log() for child in children)
    assert "claim outcome unknown" in logs or "listener lost its connection" in logs
    retried = sum(row["attempts"] - 1 for row in rows.values())
    assert logs.count(", will retry in ") == retried
    print(f"\nkilled sessions per round: {killed}; attempts retried: {retried}")


@pytest.mark.postgresql_only
def test_an_idle_worker_starts_a_new_job_at_once_through_listen(workers, run_log):
    # A 30 s poll interval: only the NOTIFY can wake the worker quickly.
    child = workers.start(HEARTBEAT_SECONDS=1, POLL_INTERVAL=30)
    workers.wait_registered(child)
    warm_up = enqueue("tests.worker.ok", {"n": -1})
    run_log.wait_for("start", warm_up, timeout=30)  # within the first poll's reach or not
    latencies = []
    for n in range(15):
        time.sleep(0.1)  # the worker is idle again, waiting on LISTEN
        job_id = enqueue("tests.worker.ok", {"n": n})  # autocommit: committed on return
        committed = time.time()
        (event,) = run_log.wait_for("start", job_id, timeout=10)
        latencies.append(event.at - committed)
    child.signal(signal.SIGTERM)
    assert child.wait(30) == 0
    median = statistics.median(latencies)
    print(f"\nenqueue-to-start latency on an idle PostgreSQL worker: median "
          f"{median * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms over {len(latencies)}")
    assert median < 0.5, latencies
    assert max(latencies) < 1.0, latencies
