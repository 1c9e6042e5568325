"""Issue 31 follow-up: a key's head is a due job whenever the key has one.

A keyed job scheduled for later (an enqueue's run_at, a retry's backoff) must
not become the head while another job of the key is due now: the head is the
due job first by priority, then by how long it has been due (an unscheduled job
since it was enqueued), and only a key with no due job offers its earliest-due
job, at its due time (decision 0052). On both databases, through OwnedJobSource.
"""

import datetime as dt

import pytest
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.keys.models import KEY_PARKED_AT, KeyParked, KeySlot
from soniq_django.models import Job
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db


def put(run_at=None, priority=100, key="acme", limit=1):
    return enqueue("keys.job", {}, concurrency_key=key, key_concurrency=limit, run_at=run_at,
                   priority=priority)


def claim(source, n=10):
    return source.claim_many_owned("w-1", claim_tokens=[nonce() for _ in range(n)])


def head(key="acme"):
    return KeySlot.objects.get(key=key).head


def test_a_job_scheduled_for_later_does_not_block_the_keys_due_job(source):
    later = timezone.now() + dt.timedelta(hours=1)
    a = put(run_at=later)
    b = put()
    assert head() == b
    (got,) = claim(source)
    assert got.job_id == b
    # A stays parked with its own due time; once B is done it is offered at that time.
    assert KeyParked.objects.get(job_id=a).run_at == later
    assert source.complete_owned(got.claim_fence) is True
    assert head() == a
    row = Job.objects.get(id=a)
    assert abs((row.scheduled_at - later).total_seconds()) < 0.01
    assert claim(source) == []


def test_a_retried_job_with_a_backoff_does_not_block_the_keys_due_jobs(source, settings):
    settings.SONIQ = {"RETRY_BASE_SECONDS": 3600, "RETRY_MAX_SECONDS": 3600}
    first, second, third = put(), put(), put()
    (got,) = claim(source)
    assert got.job_id == first
    assert source.fail_owned(got.claim_fence, "boom", retry=True) is True
    assert Job.objects.get(id=first).status == "queued"
    assert head() == second
    (got,) = claim(source)
    assert got.job_id == second
    assert source.complete_owned(got.claim_fence) is True
    assert [c.job_id for c in claim(source)] == [third]


def test_among_due_jobs_priority_then_age_wins(source):
    later = timezone.now() + dt.timedelta(hours=1)
    urgent_later = put(run_at=later, priority=1)
    put(priority=100)
    middle = put(priority=50)
    put(priority=50)
    assert head() == middle
    assert [c.job_id for c in claim(source)] == [middle]
    assert Job.objects.get(id=urgent_later).scheduled_at == KEY_PARKED_AT


def test_the_most_urgent_due_job_goes_first_though_the_most_urgent_is_later(source):
    """Version 12 of the admission offered the job due longest here (decision 0052)."""
    now = timezone.now()
    put(run_at=now + dt.timedelta(hours=1), priority=1)
    put(run_at=now - dt.timedelta(hours=2), priority=100)
    urgent_due = put(run_at=now - dt.timedelta(hours=1), priority=50)
    assert head() == urgent_due
    assert [c.job_id for c in claim(source)] == [urgent_due]


def test_among_due_jobs_of_one_priority_the_one_due_longest_goes_first(source):
    (running,) = claim(source) if put() else ()  # the key is at its limit meanwhile
    now = timezone.now()
    put(run_at=now + dt.timedelta(hours=1), priority=1)  # the most urgent is later
    enqueued = put()  # due since it was enqueued, a moment ago
    overdue = put(run_at=now - dt.timedelta(minutes=5))  # enqueued later, due longer
    just_due = put(run_at=timezone.now())  # due from after the first was enqueued
    assert source.complete_owned(running.claim_fence) is True
    for expected in (overdue, enqueued, just_due):
        assert head() == expected
        (got,) = claim(source)
        assert got.job_id == expected
        assert source.complete_owned(got.claim_fence) is True


def test_a_due_new_job_takes_the_place_of_a_head_not_yet_due(source):
    a = put(run_at=timezone.now() + dt.timedelta(hours=1), priority=1)
    assert head() == a
    b = put(priority=200)  # less urgent, but due
    assert head() == b
    assert Job.objects.get(id=a).scheduled_at == KEY_PARKED_AT
    assert [c.job_id for c in claim(source)] == [b]


def test_with_no_due_job_the_earliest_due_is_offered_at_its_time(source):
    now = timezone.now()
    put(run_at=now + dt.timedelta(hours=2), priority=1)
    soon = put(run_at=now + dt.timedelta(hours=1), priority=100)
    assert head() == soon
    assert claim(source) == []
    # A later job does not take the place of an earlier-due head, even if more urgent.
    put(run_at=now + dt.timedelta(hours=3), priority=0)
    assert head() == soon
    assert abs((Job.objects.get(id=soon).scheduled_at - (now + dt.timedelta(hours=1)))
               .total_seconds()) < 0.01


def test_a_past_run_at_is_due(source):
    later = timezone.now() + dt.timedelta(hours=1)
    put(run_at=later)
    past = put(run_at=timezone.now() - dt.timedelta(minutes=5))
    assert head() == past
    assert [c.job_id for c in claim(source)] == [past]


def test_a_job_put_back_due_sooner_takes_the_place_of_a_head_not_yet_due(source, settings):
    settings.SONIQ = {"RETRY_BASE_SECONDS": 60, "RETRY_MAX_SECONDS": 60}
    first = put(limit=2)
    (got,) = claim(source)
    assert got.job_id == first
    later = put(run_at=timezone.now() + dt.timedelta(hours=2), limit=2)
    assert head() == later
    # The retry is due in a minute, before the head: it is offered in its place.
    assert source.fail_owned(got.claim_fence, "boom", retry=True) is True
    assert head() == first
    assert Job.objects.get(id=later).scheduled_at == KEY_PARKED_AT
    assert KeyParked.objects.filter(job_id=later).exists()
    assert claim(source) == []


def parked_reads():
    """soniq_key_parked's sequential scans and tuples fetched by index in this transaction."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT coalesce(seq_scan, 0), coalesce(idx_tup_fetch, 0)"
                       " FROM pg_stat_xact_user_tables WHERE relname = 'soniq_key_parked'")
        return cursor.fetchone()


@pytest.mark.postgresql_only
def test_the_admission_reads_a_handful_of_rows_beside_a_large_backlog(source):
    """1,000 more urgent jobs scheduled for later (three priority levels) and 1,000 due: the
    head is found by one index descent per level, not by reading past the scheduled ones (a
    filtered ordered scan would fetch 1,000 rows)."""
    from django.db import connection

    first = put()
    (got,) = claim(source)
    assert got.job_id == first
    later = timezone.now() + dt.timedelta(hours=1)
    for n in range(1000):
        put(run_at=later + dt.timedelta(seconds=n), priority=1 + n % 3)
    due = [put(priority=100) for _ in range(1000)]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE soniq_key_parked")
    scans, fetched = parked_reads()
    assert source.complete_owned(got.claim_fence) is True
    assert head() == due[0]
    scans_after, fetched_after = parked_reads()
    assert scans_after == scans
    assert fetched_after - fetched < 20
