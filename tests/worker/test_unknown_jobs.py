"""A job whose name this worker has no handler for: deferred for one that has, then dead-lettered.

The rolling-deploy rule of soniq_django/worker/unknown.py, run by real
workers (in a thread, burst mode) on committed rows; the end-to-end deploy
with a second release in its own process is in test_worker_processes.py.
"""

import datetime as dt
import logging
import uuid

import pytest
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.models import DeadLetterJob, Job, TaskRegistration, Worker as WorkerRow
from soniq_django.worker import Worker
from soniq_django.worker.unknown import DEFER_MAX_SECONDS, DEFER_SECONDS, decide, defer_delay
from tests.support.owned import rewrite
from tests.support.workers import WorkerThread, run_burst, soniq

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast")]

NEW_NAME = "tests.rolling.added_by_the_next_release"  # no handler in this process


def enqueued_ago(seconds: float, **options) -> uuid.UUID:
    job_id = enqueue(NEW_NAME, {"n": 1}, **options)
    rewrite(job_id, created_at=timezone.now() - dt.timedelta(seconds=seconds))
    return job_id


def a_live_worker_knows(job_name: str, *, queues=(), status="active", heard_ago=0.0) -> str:
    """A worker row of another release (another process) that registered ``job_name``."""
    worker_id = uuid.uuid4()
    WorkerRow.objects.create(
        id=worker_id, hostname="new-release-host", pid=4242, queues=list(queues),
        status=status, last_heartbeat=timezone.now() - dt.timedelta(seconds=heard_ago))
    TaskRegistration.objects.create(task_name=job_name, worker_id=str(worker_id),
                                    queue="default", max_attempts=4)
    return str(worker_id)


def assert_deferred(job_id, since, deferrals=0) -> Job:
    """The job is deferred (its ``deferrals + 1``-th time) by a worker that ran since ``since``."""
    row = Job.objects.get(id=job_id)
    assert not DeadLetterJob.objects.filter(id=job_id).exists()
    assert (row.status, row.attempts) == ("queued", 0), "deferred without spending an attempt"
    assert since + dt.timedelta(seconds=defer_delay(deferrals, 0.5)) < row.scheduled_at
    assert row.scheduled_at <= timezone.now() + dt.timedelta(seconds=defer_delay(deferrals, 1))
    assert (row.lease_expires_at, row.pid) == (None, None)
    assert f"no handler is registered for job {NEW_NAME!r}" in row.last_error
    assert "deferred" in row.last_error
    return row


# The rule, fact by fact --------------------------------------------------------

RULE = [
    ("fresh, nobody else knows it", dict(age=1.0, knowers=0, grace=600), True),
    ("just inside the grace", dict(age=599.9, knowers=0, grace=600), True),
    ("at the end of the grace", dict(age=600.0, knowers=0, grace=600), False),
    ("old, nobody knows it", dict(age=7200.0, knowers=0, grace=600), False),
    ("old, but a live worker knows it", dict(age=7200.0, knowers=2, grace=600), True),
    ("grace 0: at once, unless someone knows it", dict(age=0.0, knowers=0, grace=0), False),
    ("grace 0, someone knows it", dict(age=0.0, knowers=1, grace=0), True),
    ("its age unknown (row gone)", dict(age=None, knowers=0, grace=600), True),
]


@pytest.mark.django_db(transaction=False)
@pytest.mark.parametrize("facts, defer", [row[1:] for row in RULE], ids=[row[0] for row in RULE])
def test_the_rule_decides(facts, defer):
    assert decide(**facts) is defer


# Real workers ----------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_fresh_job_of_an_unknown_name_is_deferred_not_dead_lettered(caplog, concurrency):
    job_id = enqueue(NEW_NAME, {"n": 1}, max_attempts=1)
    before = timezone.now()
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        assert run_burst(concurrency=concurrency) == 0
    row = assert_deferred(job_id, before)
    assert "UNKNOWN_JOB_GRACE_SECONDS (600 s)" in row.last_error
    [line] = [r.getMessage() for r in caplog.records if f"{job_id} deferred" in r.getMessage()]
    assert "deferred (no handler here" in line
    where = ("handlers are imported from each installed app's jobs.py and tasks.py and from "
             "the modules SONIQ['IMPORTS'] names")
    assert line.endswith(where) and where in row.last_error


def test_deferring_again_and_again_never_spends_an_attempt(settings):
    job_id = enqueue(NEW_NAME, max_attempts=1)
    for deferred_before in range(3):
        before = timezone.now()
        assert run_burst() == 0
        # Each deferral waits twice as long as the one before: 2.5-5 s, 5-10 s, 10-20 s.
        assert_deferred(job_id, before, deferrals=deferred_before)
        rewrite(job_id, scheduled_at=timezone.now())  # due again now
    row = Job.objects.get(id=job_id)
    assert row.claim_generation == 3  # claimed three times, no attempt counted


@pytest.mark.django_db(transaction=False)
def test_the_deferral_delay_doubles_up_to_its_cap():
    assert [defer_delay(n, 1.0) for n in range(5)] == [
        DEFER_SECONDS, 2 * DEFER_SECONDS, 4 * DEFER_SECONDS, DEFER_MAX_SECONDS,
        DEFER_MAX_SECONDS]
    assert defer_delay(10**6, 0.5) == DEFER_MAX_SECONDS / 2  # no overflow, jitter applied


def test_past_its_grace_a_job_nobody_knows_is_dead_lettered_as_job_not_found(settings):
    soniq(settings, UNKNOWN_JOB_GRACE_SECONDS=60)
    job_id = enqueued_ago(61)
    assert run_burst() == 0
    letter = DeadLetterJob.objects.get(id=job_id)
    assert not Job.objects.filter(id=job_id).exists()
    assert (letter.dead_letter_reason, letter.attempts) == ("job_not_found", 1)
    assert "no live worker registered it" in letter.last_error
    assert "UNKNOWN_JOB_GRACE_SECONDS (60 s)" in letter.last_error


def test_past_its_grace_a_job_a_live_worker_registered_is_still_deferred(settings):
    # The other direction of a deploy: this release removed the handler, the
    # old release's workers still run it.
    soniq(settings, UNKNOWN_JOB_GRACE_SECONDS=60)
    a_live_worker_knows(NEW_NAME)
    job_id = enqueued_ago(3600)
    before = timezone.now()
    assert run_burst() == 0
    row = assert_deferred(job_id, before)
    assert "for the 1 live worker(s) that registered it" in row.last_error


@pytest.mark.parametrize("knower", [
    dict(status="stopped"),
    dict(status="stopping"),
    dict(heard_ago=3600),  # silent: dead without saying so
    dict(queues=["other"]),  # alive, but never claims from this queue
])
def test_a_worker_that_cannot_take_the_job_does_not_count_as_knowing_it(settings, knower):
    soniq(settings, UNKNOWN_JOB_GRACE_SECONDS=60)
    a_live_worker_knows(NEW_NAME, **knower)
    job_id = enqueued_ago(3600)
    assert run_burst() == 0
    assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "job_not_found"


def test_a_knower_that_serves_the_jobs_queue_among_others_counts(settings):
    soniq(settings, UNKNOWN_JOB_GRACE_SECONDS=0)
    a_live_worker_knows(NEW_NAME, queues=["other", "billing"])
    job_id = enqueued_ago(3600, queue="billing")
    before = timezone.now()
    assert run_burst(queues=["billing"]) == 0
    assert_deferred(job_id, before)


def test_a_worker_does_not_count_its_own_registry_rows(settings):
    soniq(settings, UNKNOWN_JOB_GRACE_SECONDS=0)
    worker = Worker(burst=True)
    WorkerRow.objects.create(id=worker.worker_id, hostname="elsewhere", pid=1, status="active")
    TaskRegistration.objects.create(task_name=NEW_NAME, worker_id=worker.worker_id)
    job_id = enqueued_ago(10)
    assert WorkerThread(worker).start().join() == 0
    assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "job_not_found"


def test_a_cancel_requested_while_deferring_is_honoured(monkeypatch):
    from soniq_django.owned import OwnedJobSource
    from soniq_django.worker import unknown

    job_id = enqueue(NEW_NAME)
    decide_for_real = unknown.resolve

    def cancel_arrives_meanwhile(*args, **kwargs):
        OwnedJobSource().request_cancel(job_id)  # an operator, while the worker decides
        return decide_for_real(*args, **kwargs)

    monkeypatch.setattr(unknown, "resolve", cancel_arrives_meanwhile)
    assert run_burst() == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts, row.lease_expires_at) == ("cancelled", 1, None)
