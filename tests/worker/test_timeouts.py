"""Per-job time limits, enforced at the deadline by a real worker (issue 16, part 4).

Each test runs ``Worker(...).run()`` in a thread against committed rows, with
a heartbeat ten seconds apart: a timeout decided at a heartbeat (as before
deadlines.py) would come far too late for these assertions. The handlers
are in tests/testapp/jobs.py (``tests.timeouts.*``): ``short`` has
``@job(timeout=1)``, ``long`` ``@job(timeout=5)``.
"""

import logging
import re
import threading
import time

import pytest
from django.db import connection

from soniq_django import enqueue
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import OwnedJobSource
from soniq_django.worker import Worker
from tests.support.workers import WorkerThread, run_burst, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: A heartbeat every 10 s (LEASE_SECONDS / 3): far later than any deadline here.
SLOW_BEATS = {
    "RETRY_BASE_SECONDS": 0,
    "RETRY_MAX_SECONDS": 0,
    "LEASE_SECONDS": 30,
    "HEARTBEAT_SECONDS": 10,
    "POLL_INTERVAL": 0.2,
}
#: How late after its deadline a failure may be written on a busy 2-core machine.
TOLERANCE = 0.8


@pytest.fixture(autouse=True)
def slow_beats(settings):
    settings.SONIQ = dict(SLOW_BEATS)


def _dead_letter_seen(job_id) -> float:
    """Poll until ``job_id`` is dead-lettered; the ``time.time()`` at which it was seen."""
    wait_until(lambda: DeadLetterJob.objects.filter(id=job_id).exists(), 20,
               f"{job_id} to be dead-lettered")
    return time.time()


def _job_threads() -> int:
    return sum(t.name.startswith("soniq-job") for t in threading.enumerate())


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_plain_function_past_its_limit_is_failed_at_its_deadline(run_log, caplog,
                                                                   concurrency):
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    job_id = enqueue("tests.timeouts.short", {"seconds": 3}, max_attempts=1)
    worker = Worker(concurrency=concurrency)
    with WorkerThread(worker) as running:
        start = run_log.wait_for("start", job_id)[0].at
        seen = _dead_letter_seen(job_id)
        # At its deadline: not when it returned (3 s), not at a heartbeat (10 s).
        assert 1.0 - 0.1 <= seen - start <= 1.0 + TOLERANCE, seen - start
        assert not run_log.events("end", job_id), "failed only once the handler had returned"
        letter = DeadLetterJob.objects.get(id=job_id)
        assert letter.dead_letter_reason == "max_retries_exceeded"
        assert letter.last_error == "timed out after 1 s (@job(timeout=1))"
        assert (letter.moved_to_dead_letter_at.timestamp() - start) <= 1.0 + TOLERANCE
        # The handler cannot be stopped: its thread runs on, in its slot. One
        # deadline thread serves every slot.
        assert _job_threads() <= concurrency
        assert [t.name for t in threading.enumerate()].count("soniq-deadlines") == 1
        run_log.wait_for("end", job_id, timeout=10)
        wait_until(lambda: not len(worker.flights), 10, "the late handler's return")
        # What it returned was discarded: the row is the failure's.
        assert not Job.objects.filter(id=job_id).exists()
        assert DeadLetterJob.objects.get(id=job_id).last_error == letter.last_error
        assert len(worker.deadlines) == 0
        assert running.stop() == 0
    assert [t.name for t in threading.enumerate()].count("soniq-deadlines") == 0
    lines = [r.getMessage() for r in caplog.records if str(job_id) in r.getMessage()]
    # The job's line says what happened (the dead letter as for any failure) ...
    assert any(re.search(r"failed after 1\.\d{3}s \(attempt 1 of 1\) and has no attempts "
                         r"left: dead-lettered \(max_retries_exceeded\): timed out after 1 s "
                         r"\(@job\(timeout=1\)\)$", line) for line in lines), lines
    # ... then that its handler was still running, and when it came back.
    assert any("still running" in line and "slot" in line for line in lines), lines
    assert any("returned" in line and "after its timeout" in line for line in lines), lines
    assert not any(" done " in line for line in lines), lines


def test_the_settings_limit_is_enforced_at_the_deadline_too(settings, run_log):
    # Before deadlines.py, the heartbeat decided timeouts: this job finished done.
    settings.SONIQ = {**SLOW_BEATS, "JOB_TIMEOUT_SECONDS": 1}
    job_id = enqueue("tests.worker.sleep", {"seconds": 3}, max_attempts=1)
    worker = Worker()
    with WorkerThread(worker) as running:
        start = run_log.wait_for("start", job_id)[0].at
        wait_until(lambda: DeadLetterJob.objects.filter(id=job_id).exists()
                   or Job.objects.filter(id=job_id, status="done").exists(), 20,
                   "the job to end")
        seen = time.time()
        assert not Job.objects.filter(id=job_id, status="done").exists(), "it finished done"
        assert seen - start <= 1.0 + TOLERANCE, seen - start
        assert DeadLetterJob.objects.get(id=job_id).last_error.startswith("timed out after 1 s")
        wait_until(lambda: not len(worker.flights), 10, "the late handler's return")
        assert running.stop() == 0


def test_a_timed_out_runs_late_result_is_refused_by_the_fence(run_log, caplog):
    # Attempt 1 sleeps 3 s; at 1 s it is failed and retried at once in the
    # other slot, whose attempt 2 completes. Attempt 1 then returns: its
    # result must not replace attempt 2's, neither through the worker nor
    # through its own fence.
    caplog.set_level(logging.INFO, logger="soniq_django.worker")
    job_id = enqueue("tests.timeouts.short", {"seconds": 3, "first_attempt_only": True},
                     max_attempts=2)
    worker = Worker(concurrency=2)
    with WorkerThread(worker) as running:
        run_log.wait_for("start", job_id)
        wait_until(lambda: worker.flights.all(), 10, "the first run in flight")
        stale = worker.flights.all()[0].claimed.claim_fence
        wait_until(lambda: Job.objects.get(id=job_id).status == "done", 10, "the retry's result")
        done = Job.objects.get(id=job_id)
        assert (done.attempts, done.result["attempt"]) == (2, 2)
        assert time.time() - run_log.events("start", job_id)[0].at < 3, "waited for attempt 1"
        run_log.wait_for("end", job_id, count=2, timeout=10)  # attempt 1 returned too
        wait_until(lambda: not len(worker.flights), 10, "the late run's return")
        assert running.stop() == 0
    assert not OwnedJobSource().complete_owned(stale, {"late": True})
    after = Job.objects.get(id=job_id)
    assert (after.status, after.attempts, after.result, after.updated_at) == (
        "done", 2, done.result, done.updated_at)
    # The first run's line: a failure with its retry delay, as for any failure.
    assert any(re.search(r"failed after 1\.\d{3}s \(attempt 1 of 2\), will retry in 0\.0s: "
                         r"timed out after 1 s \(@job\(timeout=1\)\)$", r.getMessage())
               for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_a_per_job_limit_overrides_the_setting_both_ways(settings, run_log):
    settings.SONIQ = {**SLOW_BEATS, "JOB_TIMEOUT_SECONDS": 2}
    longer = enqueue("tests.timeouts.long", {"seconds": 3}, max_attempts=1)  # 5 s of its own
    shorter = enqueue("tests.timeouts.short", {"seconds": 1.8}, max_attempts=1)  # 1 s
    within = enqueue("tests.timeouts.short", {"seconds": 0.1}, max_attempts=1)
    default = enqueue("tests.worker.sleep", {"seconds": 4}, max_attempts=1)  # the setting's 2 s
    assert run_burst(concurrency=4, timeout=30) == 0
    assert Job.objects.get(id=longer).status == "done"  # past the setting, within its own
    assert Job.objects.get(id=within).status == "done"
    assert DeadLetterJob.objects.get(id=shorter).last_error == (
        "timed out after 1 s (@job(timeout=1))")  # within the setting, past its own
    assert DeadLetterJob.objects.get(id=default).last_error == (
        "timed out after 2 s (SONIQ['JOB_TIMEOUT_SECONDS'])")


def test_a_limit_longer_than_the_lease_is_kept_by_the_heartbeat(settings, run_log):
    # A limit is not a lease: the heartbeat keeps the claim while the run is within it.
    settings.SONIQ = {**SLOW_BEATS, "LEASE_SECONDS": 1, "HEARTBEAT_SECONDS": 0.2}
    job_id = enqueue("tests.timeouts.long", {"seconds": 2.5}, max_attempts=1)
    assert run_burst(timeout=30) == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 1)


def test_an_async_handler_is_cancelled_at_its_deadline(run_log):
    job_id = enqueue("tests.timeouts.async_short", {"seconds": 60}, max_attempts=1)
    worker = Worker()
    with WorkerThread(worker) as running:
        start = run_log.wait_for("start", job_id)[0].at
        seen = _dead_letter_seen(job_id)
        assert seen - start <= 1.0 + TOLERANCE, seen - start
        run_log.wait_for("cancelled", job_id, timeout=5)  # the coroutine itself stopped
        wait_until(lambda: not len(worker.flights), 5, "the cancelled run's return")
        assert running.stop() == 0
    letter = DeadLetterJob.objects.get(id=job_id)
    assert letter.last_error == "timed out after 1 s (@job(timeout=1))"
    assert not run_log.events("end", job_id)


@pytest.fixture
def heard():
    """``(signal name, job id, thread name, outcome, error)`` for each job_started/finished."""
    from soniq_django import signals

    calls: list[tuple[str, object, str, str | None, str | None]] = []
    lock = threading.Lock()

    def receiver(signal, sender, **kwargs):
        name = "started" if signal is signals.job_started else "finished"
        with lock:
            calls.append((name, kwargs["job_id"], threading.current_thread().name,
                          kwargs.get("outcome"), kwargs.get("error")))

    for signal in (signals.job_started, signals.job_finished):
        signal.connect(receiver, weak=False, dispatch_uid="tests.timeouts.heard")
    yield calls
    for signal in (signals.job_started, signals.job_finished):
        signal.disconnect(dispatch_uid="tests.timeouts.heard")


def test_an_async_job_on_the_shared_loop_is_cancelled_while_another_on_it_runs_on(run_log,
                                                                                   heard):
    # Above one slot, async jobs are tasks on the worker's one event loop
    # (worker/eventloop.py): the timed-out task alone is cancelled, and its
    # failure written at the deadline; the loop's other task runs on to done.
    short = enqueue("tests.timeouts.async_short", {"seconds": 60}, max_attempts=1)
    other = enqueue("tests.worker.async_sleep", {"seconds": 2.5}, max_attempts=1)
    worker = Worker(concurrency=3)
    with WorkerThread(worker) as running:
        start = run_log.wait_for("start", short)[0].at
        other_start = run_log.wait_for("start", other)[0].at
        seen = _dead_letter_seen(short)
        assert seen - start <= 1.0 + TOLERANCE, seen - start
        run_log.wait_for("cancelled", short, timeout=5)  # the task itself stopped
        assert other_start < start + 1.0  # it was on the loop when the deadline came
        assert Job.objects.get(id=other).status == "processing"  # and is still running
        wait_until(lambda: Job.objects.get(id=other).status == "done", 20, "the other job")
        wait_until(lambda: not len(worker.flights), 5, "both runs settled")
        assert running.stop() == 0
    assert DeadLetterJob.objects.get(id=short).last_error == (
        "timed out after 1 s (@job(timeout=1))")
    assert not run_log.events("end", short)
    assert Job.objects.get(id=other).attempts == 1
    started = {job_id: thread for name, job_id, thread, _, _ in heard if name == "started"}
    assert started == {short: "soniq-asyncio", other: "soniq-asyncio"}  # one loop
    finished = {job_id: (outcome, error) for name, job_id, _, outcome, error in heard
                if name == "finished"}
    assert finished == {short: ("dead", "timed out after 1 s (@job(timeout=1))"),
                        other: ("done", None)}


def test_an_async_job_that_blocks_the_shared_loop_is_still_failed_at_its_deadline(run_log):
    # A sync sleep inside ``async def`` holds the loop: the task's own timer
    # cannot fire, but the deadline thread (not on the loop) takes the final
    # write, and the main thread writes it. What the handler returns is discarded.
    job_id = enqueue("tests.timeouts.async_blocking", {"seconds": 3}, max_attempts=1)
    worker = Worker(concurrency=3)
    with WorkerThread(worker) as running:
        start = run_log.wait_for("start", job_id)[0].at
        seen = _dead_letter_seen(job_id)
        assert seen - start <= 1.0 + TOLERANCE, seen - start
        assert not run_log.events("end", job_id)  # written while the handler still ran
        run_log.wait_for("end", job_id, timeout=10)
        wait_until(lambda: not len(worker.flights), 5, "the late handler's return")
        assert running.stop() == 0
    assert DeadLetterJob.objects.get(id=job_id).last_error == (
        "timed out after 1 s (@job(timeout=1))")
    assert not Job.objects.filter(id=job_id).exists()


def test_a_handlers_own_timeout_error_is_its_failure_not_a_time_limit(run_log):
    # No limit applies here: the TimeoutError is the handler's (a client that gave up).
    job_id = enqueue("tests.timeouts.own_timeout_error", max_attempts=1)
    assert run_burst(timeout=30) == 0
    error = DeadLetterJob.objects.get(id=job_id).last_error
    assert error.startswith("Traceback (most recent call last)")
    assert error.rstrip().endswith("TimeoutError: the mail server did not answer")
    assert "timed out after" not in error


def test_a_timed_out_atomic_run_is_failed_and_its_writes_roll_back(run_log):
    from tests.testapp.models import Effect

    job_id = enqueue("tests.timeouts.atomic", {"hold": 2.5})
    worker = Worker()
    with WorkerThread(worker) as running:
        start = run_log.wait_for("start", job_id)[0].at
        wait_until(lambda: Job.objects.get(id=job_id).attempts == 2
                   or Job.objects.get(id=job_id).status == "queued", 20, "the timeout's failure")
        seen = time.time()
        if connection.vendor == "postgresql":
            # Nothing of soniq's is locked while the handler runs: written at the deadline.
            assert seen - start <= 1.0 + TOLERANCE, seen - start
            row = Job.objects.get(id=job_id)
            assert row.last_error == ("timed out after 1 s (@job(timeout=1)); the writes of "
                                      "this atomic run are rolled back")
            assert not run_log.events("end", job_id)
        # On SQLite the run's transaction holds the write lock: the failure is
        # written as soon as it ends (docs/worker.md#cancelling-and-timeouts).
        wait_until(lambda: Job.objects.get(id=job_id).status == "done", 20, "the retry")
        assert running.stop() == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 2)
    assert len(run_log.events("end", job_id)) == 2  # the first run went on to its end
    # Only the retry's write is kept: the timed-out run's rolled back.
    assert list(Effect.objects.filter(job_id=job_id).values_list("generation", "attempt")) == [
        (2, 2)]


def test_a_timed_out_plain_function_keeps_its_slot_until_it_returns(run_log):
    # One slot: the next job starts when the late handler's thread is free,
    # never while it runs (a worker runs at most `concurrency` handler threads).
    late = enqueue("tests.timeouts.short", {"seconds": 3}, max_attempts=1, priority=10)
    after = enqueue("tests.worker.ok", priority=200)
    assert run_burst(concurrency=1, timeout=30) == 0
    assert Job.objects.get(id=after).status == "done"
    ended = run_log.events("end", late)[0].at
    assert run_log.events("start", after)[0].at >= ended
    assert DeadLetterJob.objects.filter(id=late).exists()


def test_a_tasks_backend_timeout_applies_to_its_tasks(run_log):
    from tests.testapp import tasks

    try:
        from django.tasks.base import TaskResultStatus
    except ImportError:
        from django_tasks.base import TaskResultStatus

    result = tasks.sleepy.enqueue(3)  # OPTIONS: timeout 1, max_attempts 1
    started = time.monotonic()
    worker = Worker()
    with WorkerThread(worker) as running:
        wait_until(lambda: DeadLetterJob.objects.filter(id=result.id).exists(), 20,
                   "the task to time out")
        assert time.monotonic() - started < 3, "failed only once the task had returned"
        wait_until(lambda: not len(worker.flights), 10, "the late task's return")
        assert running.stop() == 0
    failed = tasks.sleepy.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert DeadLetterJob.objects.get(id=result.id).last_error == (
        "timed out after 1 s (TASKS['timeouts']['OPTIONS']['timeout'])")
