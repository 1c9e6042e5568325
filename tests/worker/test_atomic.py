"""Atomic jobs: a handler's writes commit with its fenced completion, or not at all.

Each test runs ``Worker(...).run()`` in a thread against committed rows
(tests/worker/test_worker.py does the same for plain jobs). The handlers of
tests/testapp/jobs.py write one ``Effect`` row per run, naming the run (job
id, generation); the table has no unique constraint, so a run's writes that
landed when they should not have show up as a row too many.
"""

import datetime as dt
import logging
import time

import pytest
from django.db import connection
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from soniq_django.worker import Worker
from tests.support.commits import backend_in_commit, lose_the_first_job_thread_commit, slow_commit
from tests.support.owned import nonce, rewrite
from tests.support.workers import WorkerThread, run_burst, soniq, wait_until
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast")]

BOTH_PATHS = pytest.mark.parametrize("concurrency", [1, 3])


def effects(job_id) -> list[tuple[int, int, str]]:
    """(generation, attempt, note) of every Effect row the job's runs left."""
    return list(Effect.objects.filter(job_id=job_id).order_by("id")
                .values_list("generation", "attempt", "note"))


def messages(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records]


# The writes and the completion, together -------------------------------------


@BOTH_PATHS
def test_an_atomic_jobs_writes_commit_with_its_completion(run_log, concurrency):
    job_id = enqueue("tests.atomic.effect", {"note": "once"})
    assert run_burst(concurrency=concurrency) == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts, row.claim_generation) == ("done", 1, 1)
    assert effects(job_id) == [(1, 1, "once")]
    # current_job(): the run's generation, and the job id as its idempotency key.
    assert row.result == {"generation": 1, "key": str(job_id)}


@BOTH_PATHS
def test_a_failing_atomic_run_leaves_no_writes_and_its_retry_writes_once(run_log, concurrency):
    job_id = enqueue("tests.atomic.effect", {"fail_times": 2})
    assert run_burst(concurrency=concurrency) == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 3)
    assert [e.attempt for e in run_log.events("start", job_id)] == [1, 2, 3]
    # Three runs each wrote a row; the two that raised were rolled back.
    assert effects(job_id) == [(3, 3, "")]
    assert row.result == {"generation": 3, "key": str(job_id)}  # the same key on every run


def test_a_failure_is_recorded_after_the_rollback(settings, run_log):
    soniq(settings, RETRY_BASE_SECONDS=60)  # the retry waits: see the failure as recorded
    job_id = enqueue("tests.atomic.effect", {"fail_times": 1})
    assert run_burst() == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("queued", 1)
    assert "atomic failure on attempt 1" in row.last_error
    assert effects(job_id) == []


def test_on_commit_callbacks_run_after_the_commit_and_their_failure_is_not_the_jobs(run_log,
                                                                                    caplog):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    recorded = enqueue("tests.atomic.effect", {"on_commit": "record", "fail_times": 1})
    raising = enqueue("tests.atomic.effect", {"on_commit": "raise"})
    assert run_burst() == 0
    # The failed first run's callback never ran: its transaction rolled back.
    assert [e.attempt for e in run_log.events("on-commit", recorded)] == [2]
    assert Job.objects.get(id=raising).status == "done" and len(effects(raising)) == 1
    assert any(f"{raising}: an on_commit callback" in m for m in messages(caplog))
    assert not any("recovering" in m for m in messages(caplog))


def test_an_async_atomic_handlers_orm_writes_are_in_its_transaction(run_log):
    job_id = enqueue("tests.atomic.async_effect", {"fail_times": 1})
    assert run_burst() == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 2)
    # The first run's asave() went through the job's transaction and was rolled
    # back with it; an event loop of its own would have committed it at once.
    assert effects(job_id) == [(2, 2, "async")]


# Runs whose claim went: nothing of theirs lands ------------------------------


@pytest.mark.postgresql_only  # SQLite's write lock keeps anyone from re-claiming mid-run
def test_a_run_re_claimed_mid_run_is_refused_and_its_writes_rolled_back(settings, run_log,
                                                                       caplog, tmp_path):
    # Beats far apart: the worker does not see the lease go; its completion's
    # fence, checked in its own transaction, is what refuses it.
    soniq(settings, LEASE_SECONDS=30, HEARTBEAT_SECONDS=10)
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    gate = tmp_path / "gate"
    job_id = enqueue("tests.atomic.effect", {"gate": str(gate), "note": "stale"})
    with WorkerThread(Worker(max_jobs=1)) as running:
        run_log.wait_for("start", job_id)
        rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
        other = OwnedJobSource().claim_next_owned("another-worker", claim_token=nonce())
        assert other is not None and other.claim_fence.generation == 2
        gate.touch()  # the first run returns, and tries to complete
        run_log.wait_for("end", job_id)
        wait_until(lambda: any("completion refused by the fence" in m and "rolled back" in m
                               for m in messages(caplog)), 10, "the refusal's log line")
        assert running.stop() == 0
    assert effects(job_id) == []  # the stale run's row never landed
    row = Job.objects.get(id=job_id)
    assert (row.status, row.claim_owner, row.claim_generation) == (
        "processing", "another-worker", 2)
    assert OwnedJobSource().complete_owned(other.claim_fence, {"by": "the new owner"}) is True


@pytest.mark.postgresql_only
def test_a_cancel_requested_mid_run_rolls_the_writes_back_and_is_acknowledged(settings,
                                                                             run_log, caplog,
                                                                             tmp_path):
    soniq(settings, LEASE_SECONDS=30, HEARTBEAT_SECONDS=10)  # unseen by the heartbeat too
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    gate = tmp_path / "gate"
    job_id = enqueue("tests.atomic.effect", {"gate": str(gate)})
    with WorkerThread(Worker()) as running:
        run_log.wait_for("start", job_id)
        assert OwnedJobSource().request_cancel(job_id) is True
        gate.touch()
        wait_until(lambda: Job.objects.get(id=job_id).status == "cancelled", 10,
                   "the job to be cancelled")
        assert running.stop() == 0
    assert effects(job_id) == []
    assert any(f"{job_id} cancelled" in m and "rolled back" in m for m in messages(caplog))


@pytest.mark.sqlite_only
def test_on_sqlite_a_run_that_waited_past_its_lease_for_the_write_lock_never_runs(
        settings, run_log, caplog):
    # Two atomic jobs claimed in one round: one takes SQLite's write lock and
    # holds it longer than a lease; the other waits for the lock meanwhile,
    # and its lease lapses (no heartbeat can write either). Once it has the
    # lock, its fence check refuses: its handler never runs for that claim.
    # The job runs once under its next claim.
    soniq(settings, LEASE_SECONDS=1, HEARTBEAT_SECONDS=0.2)
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    ids = [enqueue("tests.atomic.effect", {"hold": 2.5, "hold_attempts": 1, "note": str(n)})
           for n in range(2)]
    assert run_burst(concurrency=2, timeout=60) == 0
    rows = {row.id: row for row in Job.objects.filter(id__in=ids)}
    assert {row.status for row in rows.values()} == {"done"}
    first, second = sorted(ids, key=lambda job_id: rows[job_id].attempts)
    # The one that held the lock completed although its lease ran out meanwhile:
    # no one could have written its row while the lock was its own.
    assert rows[first].attempts == 1 and len(run_log.events("start", first)) == 1
    assert rows[second].attempts == 2 and len(run_log.events("start", second)) == 1
    assert [e.attempt for e in run_log.events("start", second)] == [2]
    assert effects(first) == [(1, 1, rows[first].args["note"])]
    assert effects(second) == [(2, 2, rows[second].args["note"])]
    assert any("the handler did not run" in m for m in messages(caplog))


@BOTH_PATHS
def test_a_timed_out_atomic_run_leaves_no_writes(settings, run_log, concurrency):
    soniq(settings, JOB_TIMEOUT_SECONDS=0.5)
    job_id = enqueue("tests.atomic.effect", {"hold": 1.5, "hold_attempts": 1})
    assert run_burst(concurrency=concurrency) == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 2)
    assert len(run_log.events("end", job_id)) == 2  # the first run went on to its end
    assert effects(job_id) == [(2, 2, "")]


# Leases ------------------------------------------------------------------------


def test_a_long_atomic_run_keeps_its_claim_past_one_lease(settings, run_log):
    # 3 leases long. PostgreSQL: the heartbeat renews the lease while the
    # transaction is open. SQLite: the transaction holds the write lock, so
    # no one can take the job over, and the completion checks the lease as
    # of when the lock was taken.
    soniq(settings, LEASE_SECONDS=1, HEARTBEAT_SECONDS=0.1)
    job_id = enqueue("tests.atomic.effect", {"hold": 3.0})
    with WorkerThread(Worker()) as running:
        run_log.wait_for("start", job_id)
        first = Job.objects.get(id=job_id).lease_expires_at
        time.sleep(1.5)
        during = Job.objects.get(id=job_id)
        assert during.status == "processing"
        if connection.vendor == "postgresql":
            assert during.lease_expires_at > first  # renewed
            assert during.lease_expires_at > timezone.now()
        wait_until(lambda: Job.objects.get(id=job_id).status == "done", 10, "the completion")
        assert running.stop() == 0
    assert effects(job_id) == [(1, 1, "")]


# Commits whose outcome was lost --------------------------------------------------


@BOTH_PATHS
def test_a_commit_that_landed_unacknowledged_is_recovered_and_never_run_again(
        monkeypatch, run_log, caplog, concurrency):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    job_id = enqueue("tests.atomic.effect", {"note": "landed"})
    worker, seen = Worker(burst=True, concurrency=concurrency), []
    lose_the_first_job_thread_commit(monkeypatch, worker, land=True, seen=seen)
    assert WorkerThread(worker).start().join() == 0
    assert seen == ["default"]
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 1)
    assert len(run_log.events("start", job_id)) == 1
    assert effects(job_id) == [(1, 1, "landed")]
    assert any("not acknowledged; recovering" in m for m in messages(caplog))
    assert any(f"{job_id} done after" in m for m in messages(caplog))


@BOTH_PATHS
def test_a_commit_that_failed_unseen_is_recovered_and_the_job_runs_again_once(
        monkeypatch, run_log, caplog, concurrency):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    job_id = enqueue("tests.atomic.effect", {"note": "retried"})
    worker, seen = Worker(burst=True, concurrency=concurrency), []
    lose_the_first_job_thread_commit(monkeypatch, worker, land=False, seen=seen)
    assert WorkerThread(worker).start().join() == 0
    assert seen
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 2)
    assert [e.attempt for e in run_log.events("start", job_id)] == [1, 2]
    assert effects(job_id) == [(2, 2, "retried")]


#: What the slow COMMIT's backend calls itself while it sleeps (application_name). The
#: test terminates that backend alone (tests/support/commits.py says why a name is needed:
#: terminating the registration's COMMIT instead let the job's own COMMIT land, 11 runs in 25).
SLOW_COMMIT_MARK = "soniq-test-slow-commit"


@pytest.mark.postgresql_only
def test_a_job_connection_terminated_during_commit_is_recovered_and_runs_once_more(
        run_log, caplog):
    # A deferred trigger makes the first run's COMMIT take 2 s; the test
    # terminates that backend while the COMMIT runs. The transaction never
    # commits: recovery finds the job still under the dead run's claim,
    # records the failure, and the next run writes the one row.
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    with slow_commit(SLOW_COMMIT_MARK, "NEW.note = 'slow commit' AND NEW.attempt = 1"):
        job_id = enqueue("tests.atomic.effect", {"note": "slow commit"})
        with WorkerThread(Worker(burst=True)) as running:
            committing = wait_until(lambda: backend_in_commit(SLOW_COMMIT_MARK), 20,
                                    "the job's COMMIT")
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)", [committing])
                assert cursor.fetchone() == (True,)
            assert running.join() == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 2)
    assert [e.attempt for e in run_log.events("start", job_id)] == [1, 2]
    assert effects(job_id) == [(2, 2, "slow commit")]
    assert any("not acknowledged; recovering" in m for m in messages(caplog))
    assert "the commit of this atomic run was lost" in (
        "\n".join(messages(caplog)) + (row.last_error or ""))

