"""Workers whose host clock is off decide by the database's clock (PostgreSQL).

Real worker processes under libfaketime (tests/support/faketime.py), the
database server's clock right. The unknown-job rule (worker/unknown.py)
reads a job's age, and every liveness decision (worker/peers.py, the
dashboard, soniq_status, the admin) reads a worker's heartbeat, against
the database's clock; a worker writes its heartbeat by that clock too
(worker/registration.py). On SQLite the database's clock is the host's
own -- the database is a file on that host -- so there is no other clock
to be off from, and these tests run on PostgreSQL only.
"""

import datetime as dt
import re
import signal

import pytest
from django.utils import timezone

from soniq_django import enqueue, overview
from soniq_django.models import DeadLetterJob, Job
from soniq_django.models import Worker as WorkerRow
from soniq_django.worker import peers
from tests.support.faketime import skewed
from tests.support.workers import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql_only]

NEW_NAME = "tests.rolling.added"  # a handler only tests.testapp.rolling has
STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # tests.worker_settings' log format


def _skew_of(child) -> dt.timedelta:
    """How far the child's clock is off: its first log line's time (local, as it logged it)."""
    def stamped() -> list[str]:
        return [line for line in child.log().splitlines() if STAMP.match(line)]

    wait_until(stamped, 10, "a log line")
    logged = dt.datetime.strptime(stamped()[0][:19], "%Y-%m-%d %H:%M:%S")
    return logged - dt.datetime.now()


def test_a_worker_whose_clock_is_fast_does_not_dead_letter_a_fresh_job(children):
    # 11 minutes fast, the grace 10 minutes (the default): by its own clock the job
    # was enqueued 11 minutes ago.
    job_id = enqueue(NEW_NAME, {"word": "hi"}, max_attempts=1)
    fast = children.start("soniq_worker", "--burst", env=skewed("+11m"), POLL_INTERVAL=0.2,
                          UNKNOWN_JOB_GRACE_SECONDS=600)
    assert fast.wait(60) == 0, fast.log()[-2000:]
    assert dt.timedelta(minutes=10) < _skew_of(fast) < dt.timedelta(minutes=12)
    assert not DeadLetterJob.objects.filter(id=job_id).exists(), fast.log()[-2000:]
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts, row.claim_generation) == ("queued", 0, 1)  # deferred
    assert "until UNKNOWN_JOB_GRACE_SECONDS (600 s)" in row.last_error


def test_a_worker_whose_clock_is_slow_is_still_live_to_the_others(children):
    slow = children.start("soniq_worker", "--queues", "elsewhere", env=skewed("-2m"),
                          IMPORTS=["tests.testapp.rolling"], HEARTBEAT_SECONDS=0.5,
                          POLL_INTERVAL=0.2)
    wait_until(lambda: WorkerRow.objects.filter(pid=slow.pid, status="active").exists()
               or slow.exited(), 30, "the slow worker to register")
    assert -dt.timedelta(minutes=3) < _skew_of(slow) < -dt.timedelta(minutes=1)
    beat = WorkerRow.objects.get(pid=slow.pid).last_heartbeat
    wait_until(lambda: WorkerRow.objects.get(pid=slow.pid).last_heartbeat > beat, 10,
               "a heartbeat")
    row = WorkerRow.objects.get(pid=slow.pid)
    # Its row is written by the database's clock, not its own two minutes behind.
    assert abs(row.last_heartbeat - timezone.now()) < dt.timedelta(seconds=30)
    assert abs(row.started_at - timezone.now()) < dt.timedelta(seconds=60)
    # A worker meeting the job in its queue defers it for this one, which knows it.
    assert peers.knowers("default", NEW_NAME, "elsewhere", exclude="another") == 1
    assert slow.pid in {worker.pid for worker in overview.snapshot().live_workers}
    slow.signal(signal.SIGTERM)
    assert slow.wait(30) == 0
