"""Countdowns: ``run_at=timedelta(...)`` and ``delay=``, wherever a run time is accepted.

A countdown is counted from the database's clock when the row is inserted,
because that is the clock claims compare ``scheduled_at`` with. The tests
that skew this process's clock show it: on PostgreSQL a countdown taken
from the application's clock would be off by the skew.
"""

import datetime as dt
import io
import math
import uuid
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from soniq_django import aenqueue, bulk_enqueue, enqueue
from soniq_django.errors import ConfigValidationError, ErrorCode
from soniq_django.models import Job
from soniq_django.owned import JobRequest, OwnedJobSource
from soniq_django.producer.api import database_now
from soniq_django.tasks_backend import InvalidTaskError
from tests.support.owned import nonce
from tests.testapp import tasks
from tests.testapp.jobs import add

pytestmark = pytest.mark.django_db

MINUTE = dt.timedelta(minutes=1)


def scheduled(job_id) -> dt.datetime:
    return Job.objects.values_list("scheduled_at", flat=True).get(id=job_id)


def assert_counted_from_the_database(job_id, delay: dt.timedelta, before: dt.datetime,
                                     after: dt.datetime) -> None:
    assert before + delay <= scheduled(job_id) <= after + delay


def test_every_way_of_asking_for_a_countdown_schedules_from_now(
        django_capture_on_commit_callbacks):
    async def in_a_loop():
        return [await aenqueue("tests.add", {"a": 7}, delay=MINUTE),
                await add.configure(run_at=MINUTE).aenqueue(a=8)]

    before = database_now(connection)
    with django_capture_on_commit_callbacks(execute=True):
        on_commit = add.configure(delay=60.0).enqueue_on_commit(a=4)
    ids = [
        add.configure(run_at=MINUTE).enqueue(a=1),
        add.configure(delay=60).enqueue(a=2),
        add.configure(delay=MINUTE).enqueue(a=3),
        on_commit,
        enqueue("tests.add", {"a": 5}, run_at=MINUTE),
        enqueue("tests.add", {"a": 6}, delay=60),
        *async_to_sync(in_a_loop)(),
        *bulk_enqueue([JobRequest("tests.add", {"a": 9}, run_at=MINUTE),
                       JobRequest("tests.add", {"a": 10}, delay=60),
                       JobRequest("tests.add", {"a": 11})]),
    ]
    after = database_now(connection)
    for job_id in ids[:-1]:
        assert_counted_from_the_database(job_id, MINUTE, before, after)
    assert scheduled(ids[-1]) is None


def test_a_zero_countdown_is_due_at_once():
    before = database_now(connection)
    job_id = enqueue("tests.add", {"a": 1}, delay=0)
    assert before <= scheduled(job_id) <= database_now(connection)


def test_on_commit_the_countdown_starts_when_the_row_is_inserted(
        django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job_id = add.configure(delay=MINUTE).enqueue_on_commit(a=1)
        assert not Job.objects.filter(id=job_id).exists()
        before = database_now(connection)
    assert_counted_from_the_database(job_id, MINUTE, before, database_now(connection))


def test_a_countdown_uses_the_clock_claims_use_not_this_hosts():
    # This host's clock an hour slow: a countdown taken from it would be due
    # (on PostgreSQL, whose claims read the database's clock) at once.
    slow = timezone.now() - dt.timedelta(hours=1)
    with mock.patch("django.utils.timezone.now", return_value=slow):
        job_id = add.configure(delay=MINUTE).enqueue(a=1)
        waiting = bulk_enqueue([JobRequest("tests.add", {"a": 2}, run_at=MINUTE)])[0]
        claimed = OwnedJobSource().claim_next_owned("worker-1", claim_token=nonce())
    assert claimed is None
    assert Job.objects.filter(id__in=[job_id, waiting], status="queued").count() == 2


def test_configure_run_at_and_delay_are_one_option_the_later_wins():
    at = timezone.now() + dt.timedelta(hours=5)
    first = add.configure(delay=60).configure(run_at=at).enqueue(a=1)
    assert scheduled(first) == at
    before = database_now(connection)
    second = add.configure(run_at=at).configure(delay=MINUTE).enqueue(a=2)
    assert_counted_from_the_database(second, MINUTE, before, database_now(connection))


def test_configure_refuses_run_at_and_delay_together():
    with pytest.raises(ConfigValidationError) as caught:
        add.configure(run_at=MINUTE, delay=60)
    assert caught.value.code is ErrorCode.INVALID_OPTION
    assert "run_at and delay" in caught.value.reason


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"run_at": MINUTE, "delay": 60}, "run_at or delay, not both"),
        ({"run_at": timezone.now(), "delay": 0}, "run_at or delay, not both"),
        ({"run_at": -MINUTE}, "run_at must not be a negative timedelta"),
        ({"delay": -1}, "delay must not be negative"),
        ({"delay": -MINUTE}, "delay must not be a negative timedelta"),
        ({"delay": math.inf}, "delay must be a finite number"),
        ({"delay": math.nan}, "delay must be a finite number"),
        ({"delay": 10**30}, "delay must be at most a century"),
        ({"run_at": dt.timedelta(days=40000)}, "run_at must be at most a century"),
        ({"delay": True}, "delay must be a number of seconds or a timedelta, not bool"),
        ({"delay": "30"}, "delay must be a number of seconds or a timedelta, not str"),
        ({"run_at": 30}, "run_at must be an aware datetime or a timedelta, not int"),
        ({"run_at": dt.datetime(2030, 1, 1)}, "run_at must be an aware datetime"),
    ],
)
def test_bad_countdowns_are_refused_naming_the_option(options, needle):
    with pytest.raises(ConfigValidationError) as caught:
        enqueue("tests.add", {"a": 1}, **options)
    assert caught.value.code is ErrorCode.INVALID_OPTION
    assert needle in caught.value.reason
    with pytest.raises(ConfigValidationError) as in_bulk:
        bulk_enqueue([JobRequest("tests.add", {"a": 1}, **options)])
    assert in_bulk.value.code is ErrorCode.INVALID_OPTION
    assert not Job.objects.exists()


def test_a_naive_run_at_is_refused_by_configure_too():
    with pytest.raises(ConfigValidationError) as caught:
        add.configure(run_at=dt.datetime(2030, 1, 1)).enqueue(a=1)
    assert caught.value.code is ErrorCode.INVALID_OPTION
    assert caught.value.reason == (
        "run_at must be an aware datetime (with a time zone), not a naive one")


def test_an_owned_submission_refuses_a_countdown():
    source = OwnedJobSource()
    for request in (JobRequest("tests.add", {"a": 1}, run_at=MINUTE),
                    JobRequest("tests.add", {"a": 1}, delay=60)):
        with pytest.raises(ConfigValidationError) as caught:
            source.submit_owned(request, submission_id="s-1")
        assert caught.value.code is ErrorCode.CONFIG
        assert "countdown" in caught.value.reason
    assert not Job.objects.exists()


def test_a_django_task_can_run_after_a_timedelta():
    before = database_now(connection)
    result = tasks.add.using(run_after=MINUTE).enqueue(1, 2)
    assert_counted_from_the_database(uuid.UUID(result.id), MINUTE, before,
                                     database_now(connection))
    with pytest.raises(InvalidTaskError, match="run_after must not be a negative timedelta"):
        tasks.add.using(run_after=-MINUTE)


def test_the_enqueue_command_takes_a_delay():
    out = io.StringIO()
    before = database_now(connection)
    call_command("soniq_enqueue", "tests.add", "--args", '{"a": 1}', "--delay", "60", stdout=out)
    assert_counted_from_the_database(uuid.UUID(out.getvalue().strip()), MINUTE, before,
                                     database_now(connection))
    with pytest.raises(CommandError, match="delay must not be negative"):
        call_command("soniq_enqueue", "tests.add", "--delay", "-5", stdout=io.StringIO())
    with pytest.raises(CommandError, match="not allowed with argument"):
        call_command("soniq_enqueue", "tests.add", "--delay", "5", "--run-at",
                     "2030-01-01T00:00:00+00:00", stdout=io.StringIO())
    assert Job.objects.count() == 1
