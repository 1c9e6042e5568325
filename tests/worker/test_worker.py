"""The worker in this process: every outcome lands in the right place.

Each test runs ``Worker(...).run()`` in a thread (burst mode, or stopped
with ``request_stop()``) against committed rows, exactly as a worker
process would; tests/worker/test_worker_processes.py does the same with real
processes and signals.
"""

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter

import pytest
from django.db import connection
from django.utils import timezone

from soniq_django import bulk_enqueue, enqueue
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.producer.request import JobRequest
from soniq_django.models import DeadLetterJob, Job, TaskRegistration, Worker as WorkerRow
from soniq_django.owned import OwnedJobSource
from soniq_django.registry import registered_handlers
from soniq_django.worker import Worker, registration
from tests.support.owned import rewrite
from tests.support.workers import WorkerThread, run_burst, soniq, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast")]

def dead(job_id) -> DeadLetterJob:
    assert not Job.objects.filter(id=job_id).exists(), "a dead-lettered job leaves soniq_jobs"
    return DeadLetterJob.objects.get(id=job_id)


# Outcomes --------------------------------------------------------------------


# With one slot the job thread writes its own completion; with more, the main
# loop writes completions in batches: the outcome tests run both ways.
BOTH_PATHS = pytest.mark.parametrize("concurrency", [1, 3])


@BOTH_PATHS
def test_a_job_that_returns_ends_done_with_its_result_and_expiry(run_log, concurrency):
    job_id = enqueue("tests.worker.ok", {"n": 7})
    worker = Worker(burst=True, concurrency=concurrency)
    assert WorkerThread(worker).start().join() == 0
    row = Job.objects.get(id=job_id)
    assert row.status == "done"
    assert row.attempts == 1
    assert row.result["n"] == 7
    assert row.result["job"] == str(job_id) and row.result["attempt"] == 1
    assert row.result["pid"] == os.getpid()
    assert row.claim_owner == worker.worker_id
    assert row.lease_expires_at is None and row.pid is None
    # Kept for RESULT_TTL (default 300 s) from the moment it finished.
    assert row.expires_at is not None
    assert abs((row.expires_at - row.updated_at).total_seconds() - 300) < 1
    assert [e.attempt for e in run_log.events("start", job_id)] == [1]


@BOTH_PATHS
def test_a_failing_job_is_retried_then_done(run_log, concurrency):
    job_id = enqueue("tests.worker.flaky", {"fail_times": 2})
    assert run_burst(concurrency=concurrency) == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 3)
    assert row.result["attempt"] == 3
    assert [e.attempt for e in run_log.events("start", job_id)] == [1, 2, 3]
    assert not DeadLetterJob.objects.exists()


def test_retries_back_off_exponentially_with_jitter(settings):
    soniq(settings, RETRY_BASE_SECONDS=10)
    job_id = enqueue("tests.worker.flaky", {"fail_times": 5})

    def fail_once_and_check(attempt, low, high):
        before = timezone.now()
        assert run_burst() == 0  # the retry is not due yet: burst exits
        row = Job.objects.get(id=job_id)
        assert (row.status, row.attempts) == ("queued", attempt)
        delay = (row.scheduled_at - before).total_seconds()
        assert low - 0.5 <= delay <= high + 0.5, delay
        assert f"flaky failure on attempt {attempt}" in row.last_error
        assert "Traceback (most recent call last)" in row.last_error

    # base * 2^(attempt-1), times a jitter from 0.5 to 1.
    fail_once_and_check(1, 5, 10)
    rewrite(job_id, scheduled_at=timezone.now())  # make the retry due now
    fail_once_and_check(2, 10, 20)


def test_a_job_that_keeps_failing_is_dead_lettered_with_its_traceback(run_log):
    job_id = enqueue("tests.worker.always_fails", {"message": "boom 42"}, max_attempts=3)
    assert run_burst() == 0
    letter = dead(job_id)
    assert letter.dead_letter_reason == "max_retries_exceeded"
    assert (letter.attempts, letter.max_attempts) == (3, 3)
    assert letter.last_error.startswith("Traceback (most recent call last)")
    assert "worker_always_fails" in letter.last_error  # the handler's frame
    assert letter.last_error.rstrip().endswith("ValueError: boom 42")
    assert len(run_log.events("start", job_id)) == 3


def test_a_null_max_attempts_uses_the_handlers_retries_plus_one(run_log):
    # Both handlers fail every time; DEFAULT_MAX_ATTEMPTS (4) must not be used.
    one_retry = enqueue("tests.worker.null_budget", max_attempts=None)  # retries=1
    two_retries = enqueue("tests.worker.always_fails", max_attempts=None)  # retries=2
    assert run_burst() == 0
    assert dead(one_retry).attempts == 2
    assert dead(two_retries).attempts == 3
    assert dead(one_retry).max_attempts is None  # the row's NULL is kept as it was
    assert dead(one_retry).dead_letter_reason == "max_retries_exceeded"
    assert len(run_log.events("start", one_retry)) == 2
    assert len(run_log.events("start", two_retries)) == 3


def test_permanent_failure_is_dead_lettered_at_once(run_log):
    job_id = enqueue("tests.worker.permanent")
    assert run_burst() == 0
    letter = dead(job_id)
    assert letter.dead_letter_reason == "permanent_failure"
    assert letter.attempts == 1
    assert "PermanentFailure: retrying cannot help" in letter.last_error
    assert "Traceback (most recent call last)" in letter.last_error


def test_a_job_without_a_handler_past_its_grace_is_dead_lettered_as_job_not_found(settings):
    # Within UNKNOWN_JOB_GRACE_SECONDS it would be deferred (tests/worker/test_unknown_jobs.py).
    soniq(settings, UNKNOWN_JOB_GRACE_SECONDS=0)
    job_id = enqueue("tests.worker.nobody_handles_this", {"x": 1})
    assert run_burst() == 0
    letter = dead(job_id)
    assert letter.dead_letter_reason == "job_not_found"
    assert letter.attempts == 1
    assert "tests.worker.nobody_handles_this" in letter.last_error
    assert letter.args == {"x": 1}


def test_args_that_do_not_bind_are_dead_lettered_as_invalid_arguments(run_log):
    unknown_name = enqueue("tests.add", {"a": 1, "c": 3})
    missing = enqueue("tests.add", {"b": 2})
    assert run_burst() == 0
    for job_id in (unknown_name, missing):
        letter = dead(job_id)
        assert letter.dead_letter_reason == "invalid_arguments"
        assert letter.attempts == 1
        assert "tests.add" in letter.last_error


def test_a_result_that_is_not_json_is_a_permanent_failure(run_log):
    job_id = enqueue("tests.worker.not_json")
    assert run_burst() == 0
    letter = dead(job_id)
    assert letter.dead_letter_reason == "permanent_failure"
    assert "not JSON" in letter.last_error
    assert "inside the result: a value of type set" in letter.last_error  # where, and what
    assert len(run_log.events("start", job_id)) == 1  # not retried


def test_async_handlers_run_and_see_their_job(run_log):
    ids = [enqueue("tests.worker.async_ok", {"n": n}) for n in range(3)]
    assert run_burst(concurrency=2) == 0
    for n, job_id in enumerate(ids):
        row = Job.objects.get(id=job_id)
        assert row.status == "done"
        assert row.result["is_async"] is True and row.result["n"] == n
        assert row.result["job"] == str(job_id)  # current_job() works inside the coroutine


def test_an_async_handler_over_the_timeout_is_cancelled_retried_then_dead(settings, run_log):
    soniq(settings, JOB_TIMEOUT_SECONDS=0.3)
    job_id = enqueue("tests.worker.async_sleep", {"seconds": 60}, max_attempts=2)
    assert run_burst(timeout=20) == 0  # 2 x 60 s of sleep would not fit
    letter = dead(job_id)
    assert letter.dead_letter_reason == "max_retries_exceeded"
    assert letter.attempts == 2
    assert "timed out after 0.3 s" in letter.last_error
    assert len(run_log.events("start", job_id)) == 2


@BOTH_PATHS
def test_a_sync_handler_over_the_timeout_is_told_through_its_context(settings, run_log,
                                                                    concurrency):
    soniq(settings, JOB_TIMEOUT_SECONDS=0.3)
    job_id = enqueue("tests.worker.cooperative", {"seconds": 60}, max_attempts=2)
    assert run_burst(timeout=20, concurrency=concurrency) == 0
    letter = dead(job_id)
    assert letter.dead_letter_reason == "max_retries_exceeded"
    assert letter.attempts == 2
    assert "timed out after 0.3 s" in letter.last_error
    # Each attempt's handler heard of the timeout and stopped.
    assert [e.attempt for e in run_log.events("saw-cancel", job_id)] == [1, 2]


_FINAL_WRITES = ("complete_owned", "complete_many_owned", "complete_many_and_claim_owned",
                 "fail_owned", "acknowledge_cancel_owned",
                 "_fail_and_hold")  # a timeout's failure, holding the queue slot (decision 0033)


def _record_writers(worker) -> set[tuple[str, str]]:
    """Wrap the worker's writes: which write, made by which kind of thread."""
    seen = set()
    for name in (*_FINAL_WRITES, "claim_many_owned"):
        def recording(*args, _name=name, _method=getattr(worker.source, name), **kwargs):
            if _name == "fail_owned" and args[1].startswith("timed out"):
                _name = "fail_owned (timeout)"
            thread = threading.current_thread().name
            seen.add((_name, "job" if thread.startswith("soniq-job") else thread))
            return _method(*args, **kwargs)
        setattr(worker.source, name, recording)
    return seen


@BOTH_PATHS
def test_each_final_write_is_made_by_the_thread_the_worker_docstring_names(settings, run_log,
                                                                           concurrency):
    # soniq_django/worker/loop.py: one owner per final write; the heartbeat writes none.
    soniq(settings, JOB_TIMEOUT_SECONDS=0.5)
    bulk_enqueue([JobRequest("tests.worker.ok", {"n": n}) for n in range(6)])
    failing = enqueue("tests.worker.permanent")
    late = enqueue("tests.worker.cooperative", {"seconds": 60}, max_attempts=1)
    worker = Worker(burst=True, concurrency=concurrency)
    seen = _record_writers(worker)
    assert WorkerThread(worker).start().join() == 0
    assert dead(failing).dead_letter_reason == "permanent_failure"
    assert "timed out after 0.5 s" in dead(late).last_error
    main = "test-worker"  # the thread that runs Worker.run()
    completions = ({("complete_many_and_claim_owned", "job")} if concurrency == 1 else
                   {("complete_many_and_claim_owned", main), ("complete_many_owned", main)})
    assert {w for w in seen if w[0].startswith("complete")} <= completions
    assert {w for w in seen if w[0].startswith("complete")} & completions
    assert {w for w in seen if "fail" in w[0]} == {
        ("fail_owned", "job"), ("_fail_and_hold", main)}
    assert {thread for name, thread in seen if name == "claim_many_owned"} == {main}
    assert not {thread for _, thread in seen} - {"job", main}


# Cancellation and lost leases --------------------------------------------------


def test_a_cancel_request_reaches_the_running_handler_and_is_acknowledged(run_log, caplog):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    job_id = enqueue("tests.worker.cooperative", {"seconds": 60})
    with WorkerThread(Worker()) as running:
        run_log.wait_for("start", job_id)
        assert Job.objects.get(id=job_id).status == "processing"
        assert OwnedJobSource().request_cancel(job_id) is True
        wait_until(lambda: Job.objects.get(id=job_id).status == "cancelled", 10,
                   "the job to be cancelled")
        assert running.stop() == 0
    run_log.wait_for("saw-cancel", job_id)
    row = Job.objects.get(id=job_id)
    assert row.cancel_requested is True
    assert row.lease_expires_at is None and row.expires_at is not None
    assert row.result is None
    # The worker's acknowledgement made it cancelled (not a lapsed lease: the
    # worker kept heartbeating until it acknowledged).
    assert any(f"{job_id} cancelled" in r.getMessage() for r in caplog.records)


@BOTH_PATHS
def test_a_cancel_request_to_a_handler_that_ignores_it_still_ends_cancelled(run_log,
                                                                           concurrency):
    job_id = enqueue("tests.worker.sleep", {"seconds": 1.0})
    with WorkerThread(Worker(concurrency=concurrency)) as running:
        run_log.wait_for("start", job_id)
        assert OwnedJobSource().request_cancel(job_id) is True
        run_log.wait_for("end", job_id)
        wait_until(lambda: Job.objects.get(id=job_id).status == "cancelled", 10,
                   "the job to be cancelled")
        assert running.stop() == 0
    assert Job.objects.get(id=job_id).result is None  # its return value was not recorded


def test_a_worker_that_loses_its_lease_tells_the_handler_and_writes_nothing(run_log, caplog):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    job_id = enqueue("tests.worker.cooperative", {"seconds": 60})
    # max_jobs=1: once the lease lapses the job is claimable again, and this
    # worker must not be the one to take it back.
    with WorkerThread(Worker(max_jobs=1)) as running:
        run_log.wait_for("start", job_id)
        lapsed = timezone.now() - dt.timedelta(seconds=1)
        rewrite(job_id, lease_expires_at=lapsed)  # as if heartbeats had stopped
        run_log.wait_for("saw-cancel", job_id, timeout=10)
        wait_until(lambda: any("lease lost" in r.getMessage() for r in caplog.records), 10,
                   "the lease-lost log line")
        assert running.stop() == 0
    row = Job.objects.get(id=job_id)
    assert row.result is None and not row.cancel_requested
    if row.status == "processing":  # untouched: no write from the old owner
        assert row.lease_expires_at == lapsed
    else:
        # Or settled as any lapsed lease is: the worker's housekeeping (soniq_settle_lapsed,
        # claim protocol v14) put it back in the queue, as a claim's reaper would have.
        assert connection.vendor == "postgresql" and row.status == "queued", row.status
        assert any("settled 1 lapsed leases" in r.getMessage() for r in caplog.records)
    assert not any(f"{job_id} cancelled" in r.getMessage() for r in caplog.records)


def test_the_worker_records_its_pid_on_the_running_job(run_log):
    job_id = enqueue("tests.worker.cooperative", {"seconds": 60})
    with WorkerThread(Worker()) as running:
        run_log.wait_for("start", job_id)
        wait_until(lambda: Job.objects.get(id=job_id).pid == os.getpid(), 5,
                   "the pid on the job row")
        OwnedJobSource().request_cancel(job_id)
        wait_until(lambda: Job.objects.get(id=job_id).status == "cancelled", 10,
                   "the job to be cancelled")
        running.stop()


# Limits, burst, queues ---------------------------------------------------------


def test_max_jobs_stops_after_that_many_claims(run_log):
    ids = [enqueue("tests.worker.ok", {"n": n}) for n in range(5)]
    assert WorkerThread(Worker(max_jobs=2)).start().join() == 0  # not burst: max_jobs ends it
    statuses = [Job.objects.get(id=job_id).status for job_id in ids]
    assert statuses == ["done", "done", "queued", "queued", "queued"]


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_max_jobs_holds_exactly_while_completions_claim_the_next_job(run_log, concurrency):
    # Job threads claim with their completions while the main loop fills free
    # slots: both draw on one max_jobs budget, never past it.
    ids = [enqueue("tests.worker.ok", {"n": n}) for n in range(30)]
    worker = Worker(max_jobs=7, concurrency=concurrency)
    assert WorkerThread(worker).start().join() == 0
    statuses = [Job.objects.get(id=job_id).status for job_id in ids]
    assert statuses == ["done"] * 7 + ["queued"] * 23
    assert worker.claimed_count == 7 and worker.budget.reserved == 0
    assert set(run_log.starts_per_job().values()) == {1}


def test_a_stop_ends_the_chain_of_claims_and_running_jobs_finish(run_log):
    ids = bulk_enqueue([JobRequest("tests.worker.ok", {"n": n}) for n in range(2000)])
    worker = Worker(concurrency=2)
    with WorkerThread(worker) as running:
        run_log.wait_for("start", count=20)
        worker.request_stop()
        assert running.join() == 0
    statuses = Counter(Job.objects.filter(id__in=ids).values_list("status", flat=True))
    assert statuses["processing"] == 0  # every claim made was run and written
    assert statuses["done"] == worker.claimed_count < 2000
    assert statuses["queued"] == 2000 - worker.claimed_count


def test_start_up_jitter_is_at_most_a_poll_interval_and_none_in_burst_mode(settings):
    soniq(settings, POLL_INTERVAL=0.3)
    delays = [Worker()._jitter() for _ in range(200)]
    assert all(0 <= d <= 0.3 for d in delays) and len(set(delays)) > 1
    soniq(settings, POLL_INTERVAL=5)
    assert all(0 <= Worker()._jitter() <= 1.0 for _ in range(200))  # at most 1 s
    assert Worker(burst=True)._jitter() == 0
    assert Worker(startup_jitter=0)._jitter() == 0
    assert 0 <= Worker(burst=True, startup_jitter=0.5)._jitter() <= 0.5


def test_a_stop_during_the_start_up_jitter_ends_it_at_once():
    worker = Worker(startup_jitter=60)
    running = WorkerThread(worker).start()
    wait_until(lambda: WorkerRow.objects.filter(id=worker.worker_id).exists(), 10,
               "the worker row")
    assert running.stop(timeout=5) == 0
    assert worker.claimed_count == 0


def test_burst_exits_at_once_when_nothing_is_queued():
    worker = Worker(burst=True)
    assert WorkerThread(worker).start().join(timeout=10) == 0
    assert worker.claimed_count == 0


def test_burst_runs_everything_due_then_exits(run_log):
    ids = [enqueue("tests.worker.ok", {"n": n}) for n in range(20)]
    later = enqueue("tests.worker.ok", run_at=timezone.now() + dt.timedelta(hours=1))
    assert run_burst(concurrency=3) == 0
    assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"}
    assert Job.objects.get(id=later).status == "queued"  # not due: left alone
    assert set(run_log.starts_per_job().values()) == {1}


def test_a_worker_serves_only_its_queues(run_log):
    mine = enqueue("tests.worker.ok", queue="mine")
    other = enqueue("tests.worker.ok", queue="other")
    assert run_burst(queues=["mine"]) == 0
    assert Job.objects.get(id=mine).status == "done"
    assert Job.objects.get(id=other).status == "queued"


def test_a_stop_while_waiting_for_a_slot_claims_nothing_more(tmp_path, run_log):
    go = tmp_path / "go"
    busy = enqueue("tests.worker.wait_for_file", {"path": str(go)}, priority=1)
    waiting = enqueue("tests.worker.ok")
    worker = Worker(concurrency=1)
    with WorkerThread(worker) as running:
        run_log.wait_for("start", busy)
        worker.request_stop()  # the claim loop is waiting for the one slot ...
        go.touch()  # ... which frees a few milliseconds later
        assert running.join() == 0
    assert Job.objects.get(id=busy).status == "done"
    assert Job.objects.get(id=waiting).status == "queued"
    assert worker.claimed_count == 1


def test_a_burst_worker_does_not_take_a_failed_claim_for_an_empty_queue(run_log):
    job_id = enqueue("tests.worker.ok")
    worker = Worker(burst=True)
    claim, failed = worker.source.claim_many_owned, []

    def claim_failing_once(*args, **kwargs):
        if not failed:  # the database drops the first claim (it never committed)
            failed.append(True)
            raise SoniqError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "unavailable")
        return claim(*args, **kwargs)

    worker.source.claim_many_owned = claim_failing_once
    assert WorkerThread(worker).start().join() == 0
    assert failed
    assert Job.objects.get(id=job_id).status == "done"


def test_a_burst_worker_claims_a_job_failed_back_into_the_queue_after_it_found_nothing(
        run_log):
    # The race: a round claims and finds the queue empty while a running job
    # fails and goes back to the queue (due at once); the slot then frees.
    # That empty claim is out of date: a burst worker must not exit on it.
    # The first run fails after 0.5 s: the worker's second round (a free slot) finds nothing
    # while it runs.
    job_id = enqueue("tests.worker.slow_flaky", {"fail_times": 1, "seconds": 0.5},
                     max_attempts=2)
    worker = Worker(burst=True, concurrency=2)
    round_, held = worker.completer.round, []

    def first_run_in_flight() -> bool:
        return any(flight.claimed.attempts == 1 for flight in worker.flights.all())

    def round_outrun_by_the_failure(n):
        answer = round_(n)
        if answer.found_nothing and first_run_in_flight() and not held:
            held.append(True)  # this round's answer comes back after the failure landed
            wait_until(lambda: not first_run_in_flight(), 10, "the first run's failure")
        return answer

    worker.completer.round = round_outrun_by_the_failure
    assert WorkerThread(worker).start().join(timeout=30) == 0
    assert held
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 2)


def test_a_batch_claim_whose_answer_was_lost_is_recovered_job_by_job(run_log):
    ids = [enqueue("tests.worker.ok", {"n": n}) for n in range(3)]
    worker = Worker(burst=True, concurrency=4)
    claim, lost = worker.source.claim_many_owned, []

    def claim_committed_but_unanswered(*args, **kwargs):
        claimed = claim(*args, **kwargs)
        if not lost:  # committed, then the connection died before the answer came
            lost.append([c.job_id for c in claimed])
            raise SoniqError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "unavailable")
        return claimed

    worker.source.claim_many_owned = claim_committed_but_unanswered
    assert WorkerThread(worker).start().join() == 0
    assert sorted(lost[0]) == sorted(ids)  # one call took all three
    rows = Job.objects.filter(id__in=ids)
    assert [(r.status, r.attempts) for r in rows] == [("done", 1)] * 3  # run once each
    assert worker.claimed_count == 3


@pytest.mark.parametrize("concurrency", [1, 3])  # 1: the job thread settles; 3: the main loop
def test_a_round_whose_answer_was_lost_is_recovered_without_running_anything_twice(
        run_log, caplog, concurrency):
    ids = bulk_enqueue([JobRequest("tests.worker.ok", {"n": n}) for n in range(12)])
    worker = Worker(burst=True, concurrency=concurrency)
    settle, lost = worker.source.complete_many_and_claim_owned, []

    def committed_but_unanswered(completions, **kwargs):
        answers, claimed = settle(completions, **kwargs)
        if not lost:  # committed, then the connection died before the answer came
            lost.append((len(completions), len(claimed)))
            raise SoniqError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "unavailable")
        return answers, claimed

    worker.source.complete_many_and_claim_owned = committed_but_unanswered
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        assert WorkerThread(worker).start().join() == 0
    assert lost and lost[0][0] >= 1 and lost[0][1] >= 1  # it settled and claimed
    rows = Job.objects.filter(id__in=ids)
    assert sorted((r.status, r.attempts) for r in rows) == [("done", 1)] * 12
    assert set(run_log.starts_per_job().values()) == {1}
    assert worker.claimed_count == 12
    assert "not recorded" not in caplog.text  # the recovered completions count as written
    assert caplog.text.count(" done after ") == 12


def test_the_command_refuses_bad_options():
    from django.core.management import CommandError, call_command

    for bad in (["--concurrency", "0"], ["--max-jobs", "0"], ["--worker-id", "nope"],
                ["--queues", " , "]):
        with pytest.raises(CommandError):
            call_command("soniq_worker", *bad)


@pytest.mark.django_db(transaction=True)
def test_the_command_refuses_a_database_with_migrations_to_apply():
    from django.core.management import CommandError, call_command

    call_command("migrate", "soniq_django", "0008", verbosity=0)
    try:
        with pytest.raises(CommandError) as caught:
            call_command("soniq_worker", "--burst")
        assert "0009_claim_protocol_v2" in str(caught.value)
        assert "python manage.py migrate soniq_django --database default" in str(caught.value)
    finally:
        call_command("migrate", "soniq_django", verbosity=0)
    call_command("soniq_worker", "--burst")  # migrated: it starts (and finds nothing)


# The worker's own rows ---------------------------------------------------------


def test_the_worker_row_goes_from_active_to_stopped():
    worker = Worker(queues=["a", "b"], concurrency=3)
    with WorkerThread(worker) as running:
        row = wait_until(
            lambda: WorkerRow.objects.filter(id=worker.worker_id, status="active").first(),
            10, "the worker row",
        )
        assert row.pid == os.getpid()
        assert row.hostname == socket.gethostname()[:255]
        assert (row.queues, row.concurrency) == (["a", "b"], 3)
        assert row.version == registration.implementation()
        assert row.version.startswith("soniq_django ")
        first_beat = row.last_heartbeat
        wait_until(
            lambda: WorkerRow.objects.get(id=worker.worker_id).last_heartbeat > first_beat,
            10, "a heartbeat on the worker row",
        )
        assert running.stop() == 0
    row = WorkerRow.objects.get(id=worker.worker_id)
    assert row.status == "stopped"
    # As in Soniq, a stopped row's last heartbeat is when it stopped.
    assert row.last_heartbeat >= row.started_at


def test_a_worker_of_every_queue_registers_an_empty_list_as_soniq_does():
    worker = Worker(burst=True)
    assert WorkerThread(worker).start().join() == 0
    assert WorkerRow.objects.get(id=worker.worker_id).queues == []


def test_the_loop_says_running_and_stopping_which_the_row_spells_as_soniq_does():
    worker_id = str(uuid.uuid4())
    registration.register("default", worker_id, None, 1)
    registration.beat("default", worker_id, "stopping")
    assert WorkerRow.objects.get(id=worker_id).status == "stopping"
    registration.beat("default", worker_id, "running")
    assert WorkerRow.objects.get(id=worker_id).status == "active"
    registration.unregister("default", worker_id)
    assert WorkerRow.objects.get(id=worker_id).status == "stopped"


def test_a_new_worker_in_the_same_process_replaces_the_old_row_and_detaches_its_jobs(run_log):
    # One row per (hostname, pid), as Soniq's unique index says: a restarted
    # container's pid-1 worker, or a second Worker in one process.
    first = Worker(burst=True)
    job_id = enqueue("tests.worker.ok")
    assert WorkerThread(first).start().join() == 0
    assert Job.objects.get(id=job_id).worker_id == uuid.UUID(first.worker_id)
    assert TaskRegistration.objects.filter(worker_id=first.worker_id).exists()

    second = Worker(burst=True)
    assert WorkerThread(second).start().join() == 0

    rows = WorkerRow.objects.filter(hostname=socket.gethostname()[:255], pid=os.getpid())
    assert [str(row.id) for row in rows] == [second.worker_id]
    finished = Job.objects.get(id=job_id)
    assert (finished.status, finished.worker_id, finished.claim_owner) == (
        "done", None, first.worker_id)  # the history stays; the link to a gone row does not
    assert not TaskRegistration.objects.filter(worker_id=first.worker_id).exists()
    assert TaskRegistration.objects.filter(worker_id=second.worker_id).exists()


def test_a_replaced_row_is_detached_even_from_protected_jobs(run_log):
    from soniq_django.producer.request import JobRequest

    first = Worker(burst=True)
    owned = OwnedJobSource().submit_owned(JobRequest("tests.worker.ok", {}), submission_id="s-1")
    assert WorkerThread(first).start().join() == 0
    row = Job.objects.get(id=owned)
    assert (row.status, row.fence_required, row.worker_id) == (
        "done", True, uuid.UUID(first.worker_id))
    assert WorkerThread(Worker(burst=True)).start().join() == 0
    row = Job.objects.get(id=owned)
    # Only the informational link changed; the protected row is otherwise intact.
    assert (row.status, row.fence_required, row.worker_id, row.submission_id) == (
        "done", True, None, "s-1")


def test_a_given_worker_id_is_used_for_the_row_and_the_claims(run_log):
    worker_id = str(uuid.uuid4())
    job_id = enqueue("tests.worker.ok")
    assert WorkerThread(Worker(burst=True, worker_id=worker_id)).start().join() == 0
    assert WorkerRow.objects.get(id=worker_id).status == "stopped"
    row = Job.objects.get(id=job_id)
    assert row.claim_owner == worker_id and row.worker_id == uuid.UUID(worker_id)


def test_the_task_registry_lists_every_handler_for_this_worker():
    worker = Worker(burst=True)
    assert WorkerThread(worker).start().join() == 0
    rows = {row.task_name: row for row in TaskRegistration.objects.filter(
        worker_id=worker.worker_id)}
    assert set(registered_handlers()) == set(rows)
    flaky = rows["tests.worker.flaky"]
    assert (flaky.queue, flaky.max_attempts, flaky.unique_job) == ("default", 6, False)
    report = rows["tests.unique_report"]
    assert (report.queue, report.max_attempts, report.unique_job) == ("reports", 3, True)
    assert "fail_times" in flaky.args_model_repr
    assert flaky.last_seen_at is not None
    # Published again by the same worker id: updated, not duplicated.
    assert WorkerThread(Worker(burst=True, worker_id=worker.worker_id)).start().join() == 0
    assert TaskRegistration.objects.filter(worker_id=worker.worker_id).count() == len(rows)


@pytest.fixture
def housekeeper():
    """A worker that is never run: the tests call its heartbeat's housekeeping directly.

    Its shared connection opens at the first turn; run() would close it at its end,
    so the fixture does, or that session stays open until the garbage collector runs.
    """
    worker = Worker(burst=True)
    yield worker.heartbeat
    worker.shared.close()


@pytest.mark.django_db(transaction=True)
def test_the_worker_purges_expired_rows_but_never_protected_ones(housekeeper):
    from soniq_django.producer.request import JobRequest
    from soniq_django.owned import OwnedJobSource
    from tests.support.owned import nonce, rewrite

    source = OwnedJobSource()
    owned = source.submit_owned(JobRequest("a.owned", {}), submission_id="keep-me")
    assert source.complete_owned(source.claim_next_owned("w", claim_token=nonce()).claim_fence)
    expired = enqueue("a.plain")
    assert source.complete_owned(source.claim_next_owned("w", claim_token=nonce()).claim_fence)
    past = timezone.now() - dt.timedelta(seconds=1)
    rewrite(owned, expires_at=past)
    rewrite(expired, expires_at=past)
    housekeeper.housekeep()
    assert not Job.objects.filter(id=expired).exists()
    assert Job.objects.filter(id=owned).exists()


def _expired_rows(count: int) -> list:
    ids = bulk_enqueue(JobRequest("a.plain", {"i": i}) for i in range(count))
    Job.objects.filter(id__in=ids).update(
        status="done", expires_at=timezone.now() - dt.timedelta(seconds=1))
    return ids


def test_a_purge_goes_on_while_its_batches_come_back_full(settings, monkeypatch, housekeeper):
    # One batch a beat was at most PURGE_BATCH rows per HEARTBEAT_SECONDS per
    # worker (100 rows/s by default): a faster drain grew the table forever.
    from soniq_django.worker import heartbeat

    soniq(settings, HEARTBEAT_SECONDS=10, LEASE_SECONDS=60)  # half a beat: 5 s to purge
    monkeypatch.setattr(heartbeat, "PURGE_BATCH", 3)
    _expired_rows(8)
    housekeeper.housekeep()
    assert not Job.objects.exists()
    assert housekeeper._next_purge > time.monotonic() + 50  # all gone: in a minute


@pytest.mark.django_db(transaction=True)
def test_the_worker_purge_reads_what_expired_since_its_last_complete_one(housekeeper):
    # Under an old snapshot the rows a purge deleted stay in the expires_at index: a purge
    # from the start would read them all again (decision 0035).
    _expired_rows(2)
    housekeeper.housekeep()
    assert not Job.objects.exists()
    [late] = _expired_rows(1)  # expired long before that purge: committed late, or backdated
    Job.objects.filter(id=late).update(expires_at=timezone.now() - dt.timedelta(hours=1))
    [fresh] = _expired_rows(1)  # expired since
    housekeeper._next_purge = 0.0
    housekeeper.housekeep()
    assert list(Job.objects.values_list("id", flat=True)) == [late]
    # ... the purge from the start, every FULL_PURGE_SECONDS, takes it.
    housekeeper._next_purge = housekeeper._next_full_purge = 0.0
    housekeeper.housekeep()
    assert not Job.objects.exists()
    assert fresh != late


def test_the_housekeeping_settles_lapsed_leases(housekeeper):
    # Claim protocol v14 (decision 0053): under a pinned horizon a claim reads from the
    # start of the lease index only every 300 s; the housekeeping does, once a minute, so a
    # lease that committed late (here: backdated, as the claims' hints cannot see it) is
    # settled without a claim. SQLite has no pin: its claims settle every lapsed lease, and
    # its housekeeping leaves them to them, as before.
    from django.db import connection
    from tests.support.owned import nonce

    job_id = enqueue("a.plain")
    source = OwnedJobSource()
    claimed = source.claim_next_owned("gone", claim_token=nonce())
    assert claimed.job_id == job_id
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(hours=1))
    housekeeper.housekeep()
    row = Job.objects.get(id=job_id)
    if connection.vendor == "postgresql":
        assert (row.status, row.attempts, row.lease_expires_at) == ("queued", 1, None)
    else:
        assert (row.status, row.attempts) == ("processing", 1)


def test_a_purge_stops_after_half_a_beat_and_goes_on_at_the_next(settings, monkeypatch,
                                                                 housekeeper):
    from soniq_django.worker import heartbeat

    soniq(settings, HEARTBEAT_SECONDS=0.2, LEASE_SECONDS=60)  # half a beat: 0.1 s
    monkeypatch.setattr(heartbeat, "PURGE_BATCH", 2)
    calls = []

    def slow_purge(using, *, batch, batches, after):
        calls.append(batch)
        time.sleep(0.15)
        return real_purge(using, batch=batch, batches=batches, after=after)

    real_purge = heartbeat.purge_expired
    monkeypatch.setattr(heartbeat, "purge_expired", slow_purge)
    _expired_rows(6)
    housekeeper.housekeep()
    assert calls == [2] and Job.objects.count() == 4
    assert housekeeper._next_purge <= time.monotonic()  # due again at the next beat
    housekeeper.housekeep()
    assert Job.objects.count() == 2


def test_a_stopped_worker_exits_soon_after_its_last_job_not_a_heartbeat_later(settings, run_log):
    # The heartbeat thread keeps renewing leases while running jobs drain, and
    # the worker's exit waits for it: it must end when the last job's write
    # is over, not sleep out a whole beat first.
    soniq(settings, HEARTBEAT_SECONDS=6, LEASE_SECONDS=60)
    enqueue("tests.worker.sleep", {"seconds": 0.5})
    worker = Worker(concurrency=1)
    with WorkerThread(worker) as running:
        run_log.wait_for("start")
        worker.request_stop()
        started = time.monotonic()
        assert running.join() == 0
        assert time.monotonic() - started < 3.0
