"""The attempt history (soniq_job_attempts and soniq_jobs.claimed_at), on both databases.

Each attempt that ends without finishing its job leaves one row, written in
the transaction of the write that ended it; the job's current or final
attempt is its own row. Driven through OwnedJobSource: soniq's SQL functions
on PostgreSQL, their twins on SQLite, the triggers of sql/attempts_v1.sql
(or its SQLite twin) on both.
"""

import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.attempts import job_attempts
from soniq_django.housekeeping import purge_dead_letters, purge_expired
from soniq_django.models import DeadLetterJob, Job, JobAttempt
from soniq_django.owned import OwnedJobSource
from soniq_django.replay import replay_dead_letters
from tests.support.owned import claim, rewrite

pytestmark = pytest.mark.django_db


@pytest.fixture
def source():
    return OwnedJobSource()


def _outcomes(job_id):
    return [(a.attempt, a.outcome) for a in job_attempts(job_id)]


def test_a_job_that_succeeds_at_once_records_no_row_and_its_row_tells_the_attempt(source):
    job_id = enqueue("attempts.ok")
    before = timezone.now()
    claimed = claim(source)
    row = Job.objects.get(id=job_id)
    assert row.claimed_at is not None and row.claimed_at >= before - dt.timedelta(seconds=1)
    assert [(a.outcome, a.ended_at) for a in job_attempts(job_id)] == [("running", None)]
    assert source.complete_owned(claimed.claim_fence, {"ok": 1}) is True
    assert not JobAttempt.objects.exists()
    (only,) = job_attempts(job_id)
    done = Job.objects.get(id=job_id)
    assert (only.attempt, only.outcome, only.claimed_at, only.ended_at, only.generation) == (
        1, "done", row.claimed_at, done.updated_at, claimed.claim_fence.generation)
    assert only.duration is not None and only.duration >= dt.timedelta(0)


def test_a_heartbeat_moves_updated_at_but_not_the_claim_time(source):
    job_id = enqueue("attempts.long")
    claimed = claim(source)
    claimed_at = Job.objects.get(id=job_id).claimed_at
    rewrite(job_id, updated_at=claimed_at - dt.timedelta(seconds=5),
            claimed_at=claimed_at - dt.timedelta(seconds=5))
    assert source.heartbeat_owned(claimed.claim_fence) is True
    row = Job.objects.get(id=job_id)
    assert row.claimed_at == claimed_at - dt.timedelta(seconds=5)
    assert row.updated_at > row.claimed_at


def test_each_failed_attempt_is_recorded_with_its_worker_times_and_error(source):
    job_id = enqueue("attempts.flaky", max_attempts=3)
    first = claim(source, worker="worker-a")
    assert source.fail_owned(first.claim_fence, "Boom: first", retry=True, retry_delay=0) is True
    second = claim(source, worker="worker-b")
    assert source.fail_owned(second.claim_fence, "Boom: second", retry=True, retry_delay=0)
    third = claim(source, worker="worker-c")
    assert source.complete_owned(third.claim_fence, "fine") is True
    attempts = job_attempts(job_id)
    assert [(a.attempt, a.outcome, a.claim_owner, a.error) for a in attempts] == [
        (1, "failed", "worker-a", "Boom: first"),
        (2, "failed", "worker-b", "Boom: second"),
        (3, "done", "worker-c", None),
    ]
    assert [a.generation for a in attempts] == [
        first.claim_fence.generation, second.claim_fence.generation,
        third.claim_fence.generation]
    for attempt in attempts:
        assert attempt.claimed_at is not None and attempt.ended_at >= attempt.claimed_at


def test_the_last_attempt_of_a_dead_letter_is_recorded_with_its_reason(source):
    job_id = enqueue("attempts.doomed", max_attempts=2)
    first = claim(source)
    source.fail_owned(first.claim_fence, "Nope 1", retry=True, retry_delay=0)
    second = claim(source)
    assert source.fail_owned(second.claim_fence, "Nope 2", retry=True) is True
    assert not Job.objects.filter(id=job_id).exists()
    dead = DeadLetterJob.objects.get(id=job_id)
    attempts = job_attempts(dead)
    assert [(a.attempt, a.outcome, a.dead_letter_reason, a.error) for a in attempts] == [
        (1, "failed", None, "Nope 1"), (2, "dead", "max_retries_exceeded", "Nope 2")]
    assert attempts[1].ended_at == dead.moved_to_dead_letter_at


def test_a_permanent_failure_is_dead_with_its_own_reason(source):
    job_id = enqueue("attempts.bad")
    claimed = claim(source)
    source.fail_owned(claimed.claim_fence, "ValueError: no", retry=False)
    assert _outcomes(job_id) == [(1, "dead")]
    assert job_attempts(job_id)[0].dead_letter_reason == "permanent_failure"


def test_a_lapsed_lease_reaped_by_the_next_claim_is_recorded_as_lapsed(source):
    job_id = enqueue("attempts.stuck", max_attempts=3)
    first = claim(source, worker="gone")
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    second = claim(source, worker="alive")
    assert source.complete_owned(second.claim_fence) is True
    assert source.complete_owned(first.claim_fence) is False
    attempts = job_attempts(job_id)
    assert [(a.outcome, a.claim_owner) for a in attempts] == [("lapsed", "gone"),
                                                              ("done", "alive")]
    assert "lease lapsed" in attempts[0].error


def test_a_deferral_is_recorded_and_does_not_count_an_attempt(source):
    job_id = enqueue("attempts.unknown")
    first = claim(source, worker="old")
    assert source.defer_owned(first.claim_fence, "no handler for attempts.unknown") is True
    second = claim(source, worker="new")
    source.complete_owned(second.claim_fence)
    assert [(a.attempt, a.outcome, a.claim_owner) for a in job_attempts(job_id)] == [
        (1, "deferred", "old"), (1, "done", "new")]


def test_a_cancel_acknowledged_by_the_worker_is_the_rows_attempt(source):
    job_id = enqueue("attempts.cancel")
    claimed = claim(source)
    source.request_cancel(job_id)
    assert source.acknowledge_cancel_owned(claimed.claim_fence) is True
    assert _outcomes(job_id) == [(1, "cancelled")]
    queued = enqueue("attempts.cancel_queued")
    source.request_cancel(queued)
    assert job_attempts(queued) == []


def test_a_replayed_job_keeps_its_history_and_adds_to_it(source):
    job_id = enqueue("attempts.replayed", max_attempts=1)
    source.fail_owned(claim(source).claim_fence, "first life", retry=True)
    assert list(replay_dead_letters(ids=[job_id]).replayed) == [job_id]
    again = claim(source)
    source.fail_owned(again.claim_fence, "second life", retry=True)
    assert [(a.outcome, a.error) for a in job_attempts(job_id)] == [
        ("dead", "first life"), ("dead", "second life")]


def test_history_goes_with_the_job_when_it_is_purged(source):
    job_id = enqueue("attempts.purged", max_attempts=2)
    source.fail_owned(claim(source).claim_fence, "once", retry=True, retry_delay=0)
    source.complete_owned(claim(source).claim_fence)
    kept = enqueue("attempts.kept", max_attempts=2)
    source.fail_owned(claim(source).claim_fence, "waits", retry=True, retry_delay=3600)
    assert JobAttempt.objects.filter(job_id=job_id).count() == 1
    assert purge_expired(now=timezone.now() + dt.timedelta(days=1)) == 1
    assert not JobAttempt.objects.filter(job_id=job_id).exists()
    assert JobAttempt.objects.filter(job_id=kept).count() == 1


def test_history_stays_with_the_dead_letter_and_goes_with_it(source):
    job_id = enqueue("attempts.dead", max_attempts=1)
    source.fail_owned(claim(source).claim_fence, "bye", retry=True)
    assert JobAttempt.objects.filter(job_id=job_id).count() == 1
    assert purge_dead_letters(older_than=dt.timedelta(0),
                              now=timezone.now() + dt.timedelta(days=1)) == 1
    assert not JobAttempt.objects.exists()


def test_a_job_keeps_its_newest_hundred_attempts(source):
    job_id = enqueue("attempts.many")
    for round_ in range(103):
        claimed = claim(source, worker=f"w{round_}")
        assert source.defer_owned(claimed.claim_fence, f"round {round_}") is True
    rows = list(JobAttempt.objects.filter(job_id=job_id).order_by("id"))
    assert len(rows) == JobAttempt.KEPT_PER_JOB == 100
    assert (rows[0].error, rows[-1].error) == ("round 3", "round 102")


def test_an_old_error_is_cut_to_eight_kilobytes(source):
    job_id = enqueue("attempts.verbose", max_attempts=2)
    source.fail_owned(claim(source).claim_fence, "x" * 20_000, retry=True, retry_delay=0)
    (row,) = JobAttempt.objects.filter(job_id=job_id)
    assert len(row.error) == 8192
    assert len(Job.objects.get(id=job_id).last_error) == 20_000


def test_an_old_worker_that_updates_the_row_by_hand_is_recorded_too():
    # A Soniq 0.2 worker puts a processing job back with a plain UPDATE.
    job_id = enqueue("attempts.by_hand")
    now = timezone.now()
    Job.objects.filter(id=job_id).update(status="processing", attempts=1, updated_at=now)
    Job.objects.filter(id=job_id).update(status="queued", last_error="old worker gone",
                                         updated_at=now + dt.timedelta(seconds=1))
    (only,) = job_attempts(job_id)
    assert (only.outcome, only.error, only.claimed_at) == ("failed", "old worker gone", None)
    assert connection.vendor in ("postgresql", "sqlite")
