"""A timed-out plain handler runs on, and keeps its queue's slot until it returns (issue 26, 3).

Real workers (``Worker.run()`` in a thread) on committed rows, both
databases. At a run's deadline its failure is written with a hold of the
claim's queue slot (soniq_queue_holds), in one transaction; the heartbeat
renews the hold while the handler runs on; the job thread releases it, once,
when the handler returns. The worker's own slot (decision 0017) is given
back then too, exactly once. The handlers are ``tests.timeouts.*`` of
tests/testapp/jobs.py (``short``: a plain function with ``@job(timeout=1)``).
"""

import datetime as dt
import time

import pytest
from django.utils import timezone

from soniq_django import bulk_enqueue, enqueue
from soniq_django.models import DeadLetterJob, QueueHold
from soniq_django.producer.request import JobRequest
from soniq_django.worker import Worker
from tests.support.workers import WorkerThread, soniq, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

#: A short lease, so that a hold lives through several renewals within the test.
SHORT_LEASE = {"LEASE_SECONDS": 1.5, "HEARTBEAT_SECONDS": 0.3, "POLL_INTERVAL": 0.2,
               "RETRY_BASE_SECONDS": 0, "RETRY_MAX_SECONDS": 0}


def holds() -> list[tuple]:
    return list(QueueHold.objects.values_list("job_id", "generation", "queue"))


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_timed_out_handler_holds_its_queue_slot_until_it_returns(settings, run_log,
                                                                   concurrency):
    soniq(settings, **SHORT_LEASE)
    job_id = enqueue("tests.timeouts.short", {"seconds": 3.5}, queue="api", max_attempts=1)
    worker = Worker(concurrency=concurrency)
    with WorkerThread(worker) as running:
        run_log.wait_for("start", job_id)
        wait_until(lambda: DeadLetterJob.objects.filter(id=job_id).exists(), 10,
                   "the timeout's failure")
        # Written with the failure: the slot passed from the row to the hold.
        assert holds() == [(job_id, 1, "api")]
        assert worker.slots.free == concurrency - 1  # the worker's own slot: still taken
        first = QueueHold.objects.get().lease_expires_at
        # Renewed by the heartbeat while the handler runs on, past the first lease.
        time.sleep(1.8)
        assert not run_log.events("end", job_id)
        renewed = QueueHold.objects.get().lease_expires_at
        assert renewed > first and renewed > timezone.now()
        run_log.wait_for("end", job_id, timeout=10)
        # Released when it returned, and the worker's slot given back: once each.
        wait_until(lambda: not holds() and not len(worker.flights), 10, "the release")
        assert worker.slots.free == concurrency
        assert running.stop() == 0
    assert worker.slots.free == concurrency


def test_a_handler_that_returns_before_its_deadline_takes_no_hold(settings, run_log):
    soniq(settings, **SHORT_LEASE)
    job_id = enqueue("tests.timeouts.short", {"seconds": 0.2}, queue="api")
    worker = Worker(concurrency=2)
    with WorkerThread(worker) as running:
        run_log.wait_for("end", job_id)
        wait_until(lambda: not len(worker.flights), 10, "the completion")
        assert running.stop() == 0
    assert holds() == [] and worker.slots.free == 2


def intervals(run_log) -> list[tuple[float, float]]:
    """Each handler run's (start, end), by job and attempt, from the run log."""
    ends = {(e.job_id, e.attempt): e.at for e in run_log.events("end")}
    return [(e.at, ends[(e.job_id, e.attempt)]) for e in run_log.events("start")]


def most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans],
                   key=lambda edge: (edge[0], edge[1]))
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_a_queue_limited_to_one_never_runs_two_handlers_when_one_timed_out(settings, run_log):
    # The repro of issue 26, defect 3: a 1 s limit on a 2.5 s plain function, in a queue
    # limited to one. Before holds, the job's retry (or the next job) started at the
    # deadline, beside the first run still running.
    soniq(settings, **SHORT_LEASE, QUEUES={"limited": {"concurrency": 1}})
    jobs = bulk_enqueue([JobRequest("tests.timeouts.short", {"seconds": 2.5},
                                    queue="limited", max_attempts=2) for _ in range(2)])
    worker = Worker(concurrency=3)
    with WorkerThread(worker) as running:
        run_log.wait_for("end", count=4, timeout=40)  # two jobs, two attempts each
        wait_until(lambda: not len(worker.flights), 10, "the last run's return")
        assert running.stop() == 0
    spans = intervals(run_log)
    assert len(spans) == 4
    assert most_at_once(spans) == 1, sorted(spans)
    assert set(DeadLetterJob.objects.filter(id__in=jobs).values_list(
        "dead_letter_reason", flat=True)) == {"max_retries_exceeded"}
    assert holds() == []


def test_after_an_abort_the_hold_is_left_to_lapse_and_the_worker_slot_is_given_back(
        settings, run_log):
    soniq(settings, **SHORT_LEASE)
    job_id = enqueue("tests.timeouts.short", {"seconds": 2.5}, queue="api", max_attempts=1)
    worker = Worker(concurrency=2)
    running = WorkerThread(worker).start()
    wait_until(lambda: holds(), 10, "the timeout's hold")
    worker.abort()  # nothing more is written: the hold lapses with its lease, as claims do
    assert running.join(10) == 1
    run_log.wait_for("end", job_id, timeout=10)
    wait_until(lambda: worker.slots.free == 2, 5, "the worker's slot given back")
    time.sleep(0.2)
    assert worker.slots.free == 2  # once
    [(lease,)] = QueueHold.objects.values_list("lease_expires_at")
    assert lease < timezone.now() + dt.timedelta(seconds=SHORT_LEASE["LEASE_SECONDS"])
