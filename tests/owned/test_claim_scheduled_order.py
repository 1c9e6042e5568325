"""Scheduled and unscheduled jobs are claimed in one order, on both databases.

Claim protocol v6 (decision 0018) takes the unscheduled jobs and the due
scheduled jobs from two indexes on PostgreSQL; what a claimer sees must not
change: the first queued, due jobs by (priority, created_at), whichever kind
they are, never a job scheduled for later -- with and without flow control.
"""

import datetime as dt

import pytest
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.models import Job, QueueSetting
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db

BASE = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture
def source():
    return OwnedJobSource()


def job(name, minute, *, run_in=None, priority=100, queue="default"):
    """A queued job enqueued ``minute`` minutes after BASE, due ``run_in`` from now."""
    run_at = None if run_in is None else timezone.now() + run_in
    job_id = enqueue(name, queue=queue, priority=priority, run_at=run_at)
    Job.objects.filter(id=job_id).update(created_at=BASE + dt.timedelta(minutes=minute))
    return job_id


def mixed(queue="default"):
    """Jobs of every kind, created out of claim order; returns the ids in claim order."""
    past, later = -dt.timedelta(minutes=5), dt.timedelta(hours=1)
    job("a.later_old", 0, run_in=later, queue=queue)        # never: scheduled for later
    d3 = job("a.plain_third", 3, queue=queue)
    d1 = job("a.due_first", 1, run_in=past, queue=queue)
    job("a.later_young", 4, run_in=later, priority=1, queue=queue)  # never, despite priority 1
    d2 = job("a.plain_second", 2, queue=queue)
    d0 = job("a.due_urgent", 9, run_in=past, priority=5, queue=queue)
    d4 = job("a.due_last", 5, run_in=past, queue=queue)
    return [d0, d1, d2, d3, d4]


def claim_all_one_by_one(source, queues=None):
    found = []
    while (claimed := source.claim_next_owned("w", claim_token=nonce(), queues=queues)):
        found.append(claimed.job_id)
    return found


def test_one_by_one_the_claim_order_spans_scheduled_and_unscheduled_jobs(source):
    order = mixed()
    assert claim_all_one_by_one(source) == order
    assert Job.objects.filter(status="queued").count() == 2  # the two scheduled for later


def test_a_batch_takes_the_first_of_both_kinds_in_claim_order(source):
    order = mixed()
    first = source.claim_many_owned("w", claim_tokens=[nonce() for _ in range(3)])
    assert [c.job_id for c in first] == order[:3]
    rest = source.claim_many_owned("w", claim_tokens=[nonce() for _ in range(10)])
    assert [c.job_id for c in rest] == order[3:]
    # The candidates a batch did not take were left as they were.
    assert Job.objects.filter(status="queued").count() == 2
    assert not Job.objects.filter(status="queued", claim_token__isnull=False).exists()


def test_named_queues_keep_the_order_and_leave_the_other_queues_alone(source):
    order = mixed("mine")
    others = mixed("theirs")
    assert claim_all_one_by_one(source, queues=["mine"]) == order
    assert set(claim_all_one_by_one(source)) == set(others)


def test_under_flow_control_the_free_queues_keep_the_order(source):
    # A limited queue makes every claim take the flow-control path.
    QueueSetting.objects.create(queue="limited", concurrency=100)
    limited = job("a.limited", 6, queue="limited")
    order = mixed()
    found = claim_all_one_by_one(source)
    assert [j for j in found if j != limited] == order
    # Claim order across both: "limited" (minute 6) comes after the minute-5 job.
    assert found.index(limited) == len(order)


def test_a_job_scheduled_for_later_is_claimed_once_due(source):
    later = job("a.later", 0, run_in=dt.timedelta(hours=1))
    plain = job("a.plain", 1)
    assert claim_all_one_by_one(source) == [plain]
    Job.objects.filter(id=later).update(scheduled_at=timezone.now() - dt.timedelta(seconds=1))
    assert claim_all_one_by_one(source) == [later]
