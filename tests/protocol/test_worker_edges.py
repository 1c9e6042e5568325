"""The worker at the protocol's edges: refusals are not outages; timeouts never stall heartbeats."""

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
from soniq_django.worker.flight import InFlight
from tests.support.owned import drop_refusal, nonce, refuse_updates
from tests.support.workers import run_burst

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"RETRY_BASE_SECONDS": 0, "LEASE_SECONDS": 5, "HEARTBEAT_SECONDS": 0.1,
        "POLL_INTERVAL": 0.2}


@pytest.fixture(autouse=True)
def fast(settings):
    settings.SONIQ = dict(FAST)


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


def test_a_timeouts_write_never_blocks_the_heartbeat_thread(settings):
    settings.SONIQ = {**FAST, "JOB_TIMEOUT_SECONDS": 1}
    worker = Worker()
    writers, release = [], threading.Event()

    def slow_fail(fence, error, **options):  # the database is slow to answer
        writers.append(threading.current_thread().name)
        release.wait(10)
        return True

    worker.source.fail_owned = slow_fail
    flight = _timed_out_flight()
    started = time.monotonic()
    worker.heartbeat.beat(flight)  # the heartbeat thread's turn for this job
    assert time.monotonic() - started < 1.0, "the heartbeat waited for the timeout's write"
    assert not writers, "the heartbeat wrote the timeout itself"
    assert flight.done and flight.context.cancel_requested
    assert worker.completer.pending == 1  # handed to the main loop
    worker.heartbeat.beat(flight)  # the next beat does not hand it over twice
    assert worker.completer.pending == 1
    # The job thread, finishing meanwhile, waits for the write instead of racing it.
    assert not flight.settled.acquire(blocking=False)
    main = threading.Thread(target=worker.completer.round, args=(0,), name="main-loop")
    main.start()
    release.set()
    main.join(5)
    assert writers == ["main-loop"] and worker.completer.pending == 0
    assert flight.settled.acquire(timeout=5)
    flight.settled.release()


def test_a_timeout_handed_over_after_the_loop_ended_is_not_taken(settings):
    settings.SONIQ = {**FAST, "JOB_TIMEOUT_SECONDS": 1}
    worker = Worker()
    worker.completer.close()  # the main loop is over (an abort, a grace period that ran out)
    flight = _timed_out_flight()
    worker.heartbeat.beat(flight)
    assert not flight.done and worker.completer.pending == 0
    assert flight.settled.acquire(blocking=False)  # the job thread can still settle it
    flight.settled.release()


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True, databases=["default", "server_binding"])
def test_a_worker_on_a_server_binding_connection_runs_its_rounds(caplog):
    # tests/settings.py: the test database again, with OPTIONS["server_side_binding"].
    caplog.set_level(logging.WARNING, logger="soniq_django")
    ids = [enqueue("tests.worker.ok", {"n": n}) for n in range(9)]
    assert run_burst(timeout=30, using="server_binding", concurrency=3) == 0
    assert set(Job.objects.filter(id__in=ids).values_list("status", flat=True)) == {"done"}
    assert "outcome unknown" not in caplog.text  # no round fell back to recovery
