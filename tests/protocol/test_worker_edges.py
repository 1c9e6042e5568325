"""The worker at the protocol's edges: refusals are not outages; timeouts never wait for writes."""

import logging
import threading
import time
import uuid

import pytest
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.models import Job
from soniq_django.owned.types import ClaimedJob, QueueClaimFence
from soniq_django.worker import Worker
from soniq_django.worker.context import JobContext
from soniq_django.worker.deadlines import COMPACT_AFTER
from soniq_django.worker.flight import InFlight
from soniq_django.worker.timeouts import TimeLimit
from tests.support.owned import drop_refusal, nonce, refuse_updates
from tests.support.workers import run_burst, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast")]


def _refuse_requeueing() -> None:
    """Make every UPDATE that puts a job back in the queue fail (a hostile schema)."""
    condition = "OLD.status = 'processing' AND NEW.status = 'queued'"
    refuse_updates(condition, condition)


def test_a_refused_final_write_is_logged_as_a_refusal_not_an_outage(caplog):
    caplog.set_level(logging.INFO, logger="soniq_django")
    job_id = enqueue("tests.worker.always_fails", {"message": "boom"})
    _refuse_requeueing()
    try:
        assert run_burst(timeout=20) == 0
    finally:
        drop_refusal()
    text = caplog.text
    assert "database unavailable" not in text
    assert "refused by the database (QUEUE_DATABASE_REFUSED" in text
    assert "SQLSTATE" in text
    assert "boom" not in text.split("refused by the database")[1].splitlines()[0]
    assert Job.objects.get(id=job_id).status == "processing"  # its lease will lapse


def _timed_out_flight() -> InFlight:
    job_id = uuid.uuid4()
    fence = QueueClaimFence(queue="default", job_id=str(job_id), worker_id="w", generation=1,
                            claim_token=nonce())
    claimed = ClaimedJob(job_id=job_id, job_name="tests.worker.sleep", args={}, queue="default",
                         priority=100, attempts=1, max_attempts=4,
                         lease_expires_at=timezone.now(), claim_fence=fence)
    flight = InFlight(claimed, JobContext(job_id=str(job_id), job_name=claimed.job_name,
                                          queue="default", attempts=1, max_attempts=4))
    flight.started = time.monotonic() - 60
    return flight


def _deadline_thread(worker) -> threading.Thread:
    thread = threading.Thread(target=worker.deadlines.run, name="soniq-deadlines", daemon=True)
    thread.start()
    return thread


def test_a_timeouts_write_never_blocks_the_deadline_thread(settings):
    worker = Worker()
    writers, release = [], threading.Event()

    def slow_fail(fence, error, **options):  # the database is slow to answer
        writers.append(threading.current_thread().name)
        release.wait(10)
        return True

    worker.source._fail_and_hold = slow_fail  # a timeout's failure, holding its queue slot
    limit = TimeLimit(1, "@job(timeout=1)")
    first, second = _timed_out_flight(), _timed_out_flight()
    second.started = time.monotonic() - 0.8  # due 0.2 s from now
    thread = _deadline_thread(worker)
    try:
        worker.deadlines.watch(first, limit)
        worker.deadlines.watch(second, limit)
        # Both are taken at their deadlines, though the first one's write is not made.
        wait_until(lambda: worker.completer.pending == 2, 5, "both timeouts handed over")
        assert not writers, "the deadline thread wrote a timeout itself"
        assert first.done and first.context.cancel_requested and second.done
        # The job thread, finishing meanwhile, waits for the write instead of racing it.
        assert not first.settled.acquire(blocking=False)
        main = threading.Thread(target=worker.completer.round, args=(0,), name="main-loop")
        main.start()
        release.set()
        main.join(5)
        assert set(writers) == {"main-loop"} and len(writers) == 2
        assert worker.completer.pending == 0
        assert first.settled.acquire(timeout=5)
        first.settled.release()
    finally:
        release.set()
        worker.deadlines.close()
        thread.join(5)
    assert not thread.is_alive()


def test_a_timeout_after_the_loop_ended_is_not_taken(settings):
    worker = Worker()
    worker.completer.close()  # the main loop is over (an abort, a grace period that ran out)
    flight = _timed_out_flight()
    thread = _deadline_thread(worker)
    try:
        worker.deadlines.watch(flight, TimeLimit(1, "@job(timeout=1)"))
        wait_until(lambda: not len(worker.deadlines), 5, "the deadline to be acted on")
        assert not flight.done and worker.completer.pending == 0
        assert flight.settled.acquire(blocking=False)  # the job thread can still settle it
        flight.settled.release()
    finally:
        worker.deadlines.close()
        thread.join(5)


def test_the_deadline_heap_forgets_settled_runs(settings):
    # A worker that runs many short jobs under a long limit must not keep
    # every deadline until it is due.
    worker = Worker()
    limit = TimeLimit(3600, "@job(timeout=3600)")
    for _ in range(2000):
        flight = _timed_out_flight()
        flight.started = time.monotonic()
        worker.deadlines.watch(flight, limit)
        worker.deadlines.forget(flight)
    assert len(worker.deadlines) <= 2 * COMPACT_AFTER + 2
    assert not worker.deadlines._by_run


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True, databases=["default", "server_binding"])
def test_a_worker_on_a_server_binding_connection_runs_its_rounds(caplog):
    # tests/settings.py: the test database again, with OPTIONS["server_side_binding"].
    caplog.set_level(logging.WARNING, logger="soniq_django")
    ids = [enqueue("tests.worker.ok", {"n": n}) for n in range(9)]
    assert run_burst(timeout=30, using="server_binding", concurrency=3) == 0
    assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"}
    assert "outcome unknown" not in caplog.text  # no round fell back to recovery
