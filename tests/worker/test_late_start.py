"""A run whose handler could not start for half a lease after its claim (Writes.may_start).

The worker process is "stopped" between a claim and its handler's start: the
hand-over to the job threads (or to the event loop) waits, and no lease is
renewed meanwhile (the heartbeat is stopped too, as a SIGSTOP stops every
thread). Seen in the keys chaos run: a worker stopped past the lease right
after it claimed started the handler when it woke, beside the next run of
the same key (which had claimed the job again). Now the late run's lease is
renewed first: gone, the handler does not start; still held, it starts.
"""

import threading
import time
import uuid

import pytest

from soniq_django import enqueue
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from soniq_django.worker import Worker
from soniq_django.worker.heartbeat import Heartbeat
from soniq_django.worker.threads import JobThreads
from tests.support.workers import WorkerThread, soniq, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 2.0


class Stop:
    """The worker's first hand-over of claimed jobs waits until ``resume``; no renewals then."""

    def __init__(self, monkeypatch):
        self.stopped = threading.Event()
        self.resume = threading.Event()
        real_submit_many, real_renew = JobThreads.submit_many, Heartbeat.renew

        def submit_many(threads, items):
            self._pause()
            return real_submit_many(threads, items)

        def renew(heartbeat, flights, deadline):
            if self.stopped.is_set() and not self.resume.is_set():
                return None  # the process is stopped: no thread renews anything
            return real_renew(heartbeat, flights, deadline)

        from soniq_django.worker.eventloop import EventLoop
        real_start = EventLoop.start

        def start(loop, flights):
            self._pause()
            return real_start(loop, flights)

        monkeypatch.setattr(JobThreads, "submit_many", submit_many)
        monkeypatch.setattr(Heartbeat, "renew", renew)
        monkeypatch.setattr(EventLoop, "start", start)

    def _pause(self) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            assert self.resume.wait(30), "the test never resumed the worker"


def _claimed_by_the_worker(job_id) -> None:
    wait_until(lambda: Job.objects.filter(id=job_id, status="processing").exists(), 20,
               "the worker's claim")


@pytest.mark.parametrize("job_name", ["tests.worker.ok", "tests.worker.async_ok"])
def test_a_handler_whose_claim_lapsed_before_it_started_does_not_start(
        settings, monkeypatch, run_log, caplog, job_name):
    soniq(settings, LEASE_SECONDS=LEASE, HEARTBEAT_SECONDS=0.1)
    stop = Stop(monkeypatch)
    job_id = enqueue(job_name, {}, max_attempts=5)
    worker = Worker(concurrency=2)
    with WorkerThread(worker) as running:
        _claimed_by_the_worker(job_id)
        assert stop.stopped.wait(10)
        # While the worker is "stopped", its lease lapses and another worker claims the job.
        time.sleep(LEASE + 0.2)
        other = OwnedJobSource().claim_next_owned("other-worker", claim_token=uuid.uuid4().hex)
        assert other is not None and str(other.job_id) == str(job_id)
        stop.resume.set()
        wait_until(lambda: not len(worker.flights), 10, "the late run to be forgotten")
        time.sleep(0.3)  # time enough for a handler to have started, had it been let
        assert run_log.events("start", job_id) == [], "the lapsed claim's handler started"
        assert "not started; its claim was" in caplog.text
        # The other worker's run ends the job; this worker's slot was given back.
        assert OwnedJobSource().complete_owned(other.claim_fence, {"by": "other"})
        later = enqueue(job_name, {}, max_attempts=5)
        wait_until(lambda: Job.objects.filter(id=later, status="done").exists(), 10,
                   "the next job to run in the freed slot")
        assert running.stop() == 0
    assert Job.objects.get(id=job_id).result == {"by": "other"}


def test_a_late_handler_whose_claim_still_holds_starts_after_renewing_it(
        settings, monkeypatch, run_log):
    soniq(settings, LEASE_SECONDS=2 * LEASE, HEARTBEAT_SECONDS=0.1)
    stop = Stop(monkeypatch)
    job_id = enqueue("tests.worker.ok", {}, max_attempts=5)
    worker = Worker(concurrency=2)
    with WorkerThread(worker) as running:
        _claimed_by_the_worker(job_id)
        assert stop.stopped.wait(10)
        # Past half the lease, well before its end: the start renews it and runs.
        time.sleep(LEASE * 1.2)
        stop.resume.set()
        wait_until(lambda: Job.objects.filter(id=job_id, status="done").exists(), 10,
                   "the late run to finish")
        assert len(run_log.events("start", job_id)) == 1
        assert running.stop() == 0
    job = Job.objects.get(id=job_id)
    assert job.attempts == 1  # the same claim ran it: no second claim
