"""A graceful stop is bounded: at the end of ``--grace`` every running job is asked to stop,
and the process exits within a few seconds whatever its handlers do (decision 0032).

Real ``soniq_worker`` processes on the test database (the ``children`` fixture), signalled as
systemd or ``docker stop`` would. Committed rows (``transaction=True``) so the children see
them; short leases so that an abandoned job comes back within the test.
"""

import signal
import time

import pytest
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.models import Job, Worker as WorkerRow
from soniq_django.owned import OwnedJobSource
from soniq_django.worker import Worker
from tests.support.workers import WorkerThread, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"LEASE_SECONDS": 2, "HEARTBEAT_SECONDS": 0.2, "POLL_INTERVAL": 0.2}
GRACE = 1.0
#: What "within a few seconds of the grace" means here: the wind-up given to runs asked to
#: stop (2 s), the worker's last bounded steps (at most 2 s of joins, 2 s of final writes),
#: and a child's interpreter on a busy machine.
AFTER_GRACE = 7.0


def _stop_and_time(child, run_log, job_id) -> tuple[int, float]:
    """SIGTERM ``child`` once ``job_id`` runs there; (exit status, seconds until it exited)."""
    run_log.wait_for("start", job_id, timeout=30)
    signalled = time.monotonic()
    child.signal(signal.SIGTERM)
    code = child.wait(GRACE + 30)  # the old worker: the 60 s the handler runs
    return code, time.monotonic() - signalled


@pytest.mark.parametrize("concurrency", ["1", "2"])
def test_a_cooperative_handler_is_asked_to_stop_at_the_end_of_the_grace(
    children, run_log, concurrency
):
    job_id = enqueue("tests.worker.cooperative", {"seconds": 60})
    child = children.start("soniq_worker", "--grace", str(GRACE), "--concurrency", concurrency,
                           **FAST)
    code, took = _stop_and_time(child, run_log, job_id)

    assert code == 0, child.log()[-3000:]  # every run ended, and was written
    assert took < GRACE + AFTER_GRACE, child.log()[-3000:]
    (seen,) = run_log.events("saw-cancel", job_id)  # raise_if_cancelled() raised
    (start,) = run_log.events("start", job_id)
    assert seen.at - start.at >= GRACE - 0.1  # not before the grace was over
    # Given back at once, without spending an attempt: due now, for any worker.
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts, row.lease_expires_at) == ("queued", 0, None)
    assert row.scheduled_at is None or row.scheduled_at <= timezone.now()
    assert "stopped" in row.last_error
    assert child.count("grace period over") == 1
    assert child.count(f"{job_id} given back") == 1
    assert WorkerRow.objects.get(pid=child.pid).status == "stopped"

    rescuer = children.start("soniq_worker", **FAST)  # another worker runs it again at once
    (again,) = run_log.wait_for("start", job_id, count=2, timeout=10)[1:]
    assert (again.pid, again.attempt) == (rescuer.pid, 1)


def test_a_handler_that_ignores_the_request_is_abandoned_and_the_process_exits(
    children, run_log
):
    job_id = enqueue("tests.worker.sleep", {"seconds": 60, "first_attempt_only": True})
    child = children.start("soniq_worker", "--grace", str(GRACE), **FAST)
    code, took = _stop_and_time(child, run_log, job_id)

    assert code == 1, child.log()[-3000:]  # a job was abandoned
    assert took < GRACE + AFTER_GRACE, child.log()[-3000:]
    assert not run_log.events("end", job_id)  # the handler never returned
    assert child.count("grace period over") == 1
    assert child.count("abandoning 1 job(s)") == 1
    assert child.count("stopped after 1 jobs (1 abandoned)") == 1
    assert WorkerRow.objects.get(pid=child.pid).status == "stopped"  # its last write, bounded
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("processing", 1)

    # Its lease lapses (2 s) and the job runs again elsewhere.
    wait_until(lambda: Job.objects.get(id=job_id).lease_expires_at < timezone.now(), 10,
               "the abandoned lease to lapse")
    rescuer = children.start("soniq_worker", "--burst", **FAST)
    assert rescuer.wait(30) == 0
    done = Job.objects.get(id=job_id)
    assert (done.status, done.attempts) == ("done", 2)
    assert [e.attempt for e in run_log.events("start", job_id)] == [1, 2]


# The worker in this process (Worker.run() in a thread) ----------------------------------


@pytest.mark.parametrize("concurrency", [1, 2])
def test_an_async_handler_on_the_event_loop_is_asked_to_stop_too(run_log, settings,
                                                                  concurrency):
    settings.SONIQ = {**FAST}
    job_id = enqueue("tests.worker.async_cooperative", {"seconds": 60})
    worker = Worker(concurrency=concurrency, grace_seconds=0.5, startup_jitter=0)
    with WorkerThread(worker) as running:
        run_log.wait_for("start", job_id, timeout=10)
        worker.request_stop()
        assert running.join(10) == 0
    assert run_log.events("saw-cancel", job_id)
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts, row.lease_expires_at) == ("queued", 0, None)
    assert worker.writes.tally == {"given back": 1}


def test_a_cancel_pending_when_the_stop_request_lands_wins_over_giving_the_job_back(
    run_log, settings, caplog
):
    # Beats 10 s apart: the heartbeat reads no cancel between the beat that a stop makes at
    # once and the end of the grace; the deferral is refused, and the cancel acknowledged.
    settings.SONIQ = {"LEASE_SECONDS": 30, "HEARTBEAT_SECONDS": 10, "POLL_INTERVAL": 0.2}
    job_id = enqueue("tests.worker.cooperative", {"seconds": 60})
    worker = Worker(grace_seconds=1.0, startup_jitter=0)
    with WorkerThread(worker) as running:
        run_log.wait_for("start", job_id, timeout=10)
        worker.request_stop()
        time.sleep(0.3)  # the stop's own beat is over
        assert OwnedJobSource().request_cancel(job_id)
        assert running.join(10) == 0
    assert run_log.events("saw-cancel", job_id)
    assert "grace period over; asking 1 running job(s) to stop" in caplog.text
    assert Job.objects.get(id=job_id).status == "cancelled"
    assert worker.writes.tally == {"cancelled": 1}


def test_a_handler_that_returns_after_the_request_is_given_back_not_done(run_log, settings):
    # It may have returned early (as after a cancel): its result is not kept; it runs again.
    settings.SONIQ = {**FAST}
    job_id = enqueue("tests.worker.sleep", {"seconds": 1.5})
    worker = Worker(grace_seconds=0.5, startup_jitter=0)
    with WorkerThread(worker) as running:
        run_log.wait_for("start", job_id, timeout=10)
        worker.request_stop()
        assert running.join(10) == 0
    assert run_log.events("end", job_id)  # it returned, within the wind-up
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts, row.result) == ("queued", 0, None)
    assert worker.writes.tally == {"given back": 1}
