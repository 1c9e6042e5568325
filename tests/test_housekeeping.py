"""Housekeeping: expired finished jobs are purged; protected owned rows never are."""

import datetime as dt
import io
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.housekeeping import purge_dead_letters, purge_expired
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import JobRequest, OwnedJobSource
from tests.support.concurrency import run_threads
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db

HOUR = dt.timedelta(hours=1)


def finished(status="done", expires_in=-HOUR, **values) -> Job:
    """A finished, unprotected row expiring ``expires_in`` from now (negative: expired)."""
    expires_at = None if expires_in is None else timezone.now() + expires_in
    return Job.objects.create(job_name="a.job", status=status, expires_at=expires_at, **values)


def owned_done(submission_id: str):
    """An owned submission, claimed and completed through the owned API; returns its id."""
    source = OwnedJobSource()
    job_id = source.submit_owned(JobRequest("a.owned", {"n": 1}), submission_id=submission_id)
    claimed = source.claim_next_owned("worker-1", claim_token=nonce())
    assert claimed.job_id == job_id
    assert source.complete_owned(claimed.claim_fence, {"ok": True})
    rewrite(job_id, expires_at=timezone.now() - HOUR)  # its result expired long ago
    return job_id


def owned_cancelled(submission_id: str):
    source = OwnedJobSource()
    job_id = source.submit_owned(JobRequest("a.owned", {"n": 2}), submission_id=submission_id)
    assert source.request_cancel(job_id)
    rewrite(job_id, expires_at=timezone.now() - HOUR)
    return job_id


def ids() -> set:
    return set(Job.objects.values_list("id", flat=True))


# What is purged, what is kept ----------------------------------------------


def test_expired_done_and_cancelled_rows_are_purged_and_counted():
    gone = {finished("done").id, finished("cancelled").id}
    kept = {finished("done", expires_in=HOUR).id, finished("cancelled", expires_in=HOUR).id,
            finished("done", expires_in=None).id}
    assert purge_expired() == 2
    assert ids() == kept
    assert not gone & ids()


def test_queued_and_processing_rows_are_never_purged_even_with_a_past_expires_at():
    # expires_at on a live row is nonsense, but a live job must never vanish.
    kept = {finished("queued").id, finished("processing").id}
    assert purge_expired() == 0
    assert ids() == kept


def test_protected_owned_rows_are_never_purged():
    protected = {
        owned_done("sub-done"),
        owned_cancelled("sub-cancelled"),
        finished("done", fence_required=True).id,
        # Either marker alone protects (an inconsistent row is kept, not guessed about).
        finished("done", submission_id="sub-orphan").id,
    }
    plain = finished("done").id
    assert purge_expired() == 1
    assert ids() == protected
    assert plain not in ids()
    # The identity still answers an exact owned replay.
    again = OwnedJobSource().submit_owned(JobRequest("a.owned", {"n": 1}), submission_id="sub-done")
    assert again in protected


def test_an_owned_claim_of_an_ordinary_job_does_not_protect_it_once_finished():
    job_id = enqueue("a.legacy")
    source = OwnedJobSource()
    claimed = source.claim_next_owned("worker-1", claim_token=nonce())
    assert source.complete_owned(claimed.claim_fence, None)
    Job.objects.filter(id=job_id).update(expires_at=timezone.now() - HOUR)
    assert purge_expired() == 1
    assert job_id not in ids()


@pytest.mark.postgresql_only
def test_protection_is_in_the_query_not_left_to_the_trigger():
    # With the trigger's gate open for the whole session, the trigger would let
    # these deletes through: only purge_expired's own filter keeps the rows.
    protected = {owned_done("sub-1"), finished("done", fence_required=True).id}
    with connection.cursor() as cursor:
        cursor.execute("SELECT set_config('soniq.fenced_write', 'on', false)")
    try:
        assert purge_expired() == 0
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('soniq.fenced_write', 'off', false)")
    assert ids() == protected


def test_now_replaces_the_clock():
    later = finished("done", expires_in=HOUR).id
    assert purge_expired() == 0
    assert purge_expired(now=timezone.now() + 2 * HOUR) == 1
    assert later not in ids()


def test_after_leaves_the_rows_that_expired_at_or_before_it():
    older = finished("done", expires_in=-2 * HOUR).id
    newer = finished("done", expires_in=-HOUR / 2).id
    assert purge_expired(after=timezone.now() - HOUR) == 1
    assert ids() == {older} and newer not in ids()
    assert purge_expired() == 1
    with pytest.raises(ValueError, match="after must be an aware datetime"):
        purge_expired(after=dt.datetime(2030, 1, 1))


def test_purges_in_batches_until_nothing_is_left():
    Job.objects.bulk_create(
        Job(job_name="a.job", status="done", expires_at=timezone.now() - HOUR) for _ in range(25)
    )
    seen = []
    assert purge_expired(batch=10, progress=seen.append) == 25
    assert seen == [10, 20, 25]
    assert not Job.objects.exists()


def test_purges_at_most_the_batches_it_is_allowed():
    # The worker's heartbeat purges one batch at a time on the shared connection.
    Job.objects.bulk_create(
        Job(job_name="a.job", status="done", expires_at=timezone.now() - HOUR) for _ in range(25)
    )
    assert purge_expired(batch=10, batches=2) == 20
    assert Job.objects.count() == 5
    assert purge_expired(batch=10, batches=1) == 5
    assert not Job.objects.exists()


@pytest.mark.parametrize("batch", [0, -1, 1.5, True])
def test_a_bad_batch_is_refused(batch):
    with pytest.raises(ValueError):
        purge_expired(batch=batch)
    with pytest.raises(ValueError):
        purge_expired(batches=batch)


def test_a_naive_now_is_refused():
    with pytest.raises(ValueError):
        purge_expired(now=dt.datetime(2030, 1, 1))


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_concurrent_purges_share_the_work_without_errors():
    Job.objects.bulk_create(
        Job(job_name="a.job", status="done", expires_at=timezone.now() - HOUR) for _ in range(400)
    )
    totals = run_threads(lambda _: purge_expired(batch=7), 4)
    assert sum(totals) == 400
    assert not Job.objects.exists()


# Dead letters ----------------------------------------------------------------


def dead_letter(age: dt.timedelta, **values) -> DeadLetterJob:
    return DeadLetterJob.objects.create(
        id=uuid.uuid4(), job_name="a.job",
        dead_letter_reason="permanent_failure",
        moved_to_dead_letter_at=timezone.now() - age, **values,
    )


def test_old_unprotected_dead_letters_are_purged_and_protected_ones_kept():
    old = dead_letter(30 * 24 * HOUR)
    recent = dead_letter(HOUR)
    owned = dead_letter(30 * 24 * HOUR, submission_id="sub-1", fence_required=True)
    replayed = dead_letter(30 * 24 * HOUR)
    Job.objects.create(id=replayed.id, job_name="a.job")  # back in the queue after a replay
    assert purge_dead_letters(older_than=dt.timedelta(days=7), dry_run=True) == 1
    assert DeadLetterJob.objects.count() == 4
    assert purge_dead_letters(older_than=dt.timedelta(days=7)) == 1
    left = set(DeadLetterJob.objects.values_list("id", flat=True))
    assert left == {recent.id, owned.id, replayed.id}
    assert old.id not in left


def test_dead_letters_purge_in_batches():
    for _ in range(5):
        dead_letter(48 * HOUR)
    assert purge_dead_letters(older_than=HOUR, batch=2) == 5
    assert not DeadLetterJob.objects.exists()


def test_a_negative_age_is_refused():
    with pytest.raises(ValueError):
        purge_dead_letters(older_than=-HOUR)


# The command ------------------------------------------------------------------


def test_purge_command_prints_the_count_and_plain_progress_lines():
    Job.objects.bulk_create(
        Job(job_name="a.job", status="done", expires_at=timezone.now() - HOUR) for _ in range(5)
    )
    out = io.StringIO()  # not a terminal
    call_command("soniq_purge", "--batch", "2", stdout=out)
    assert out.getvalue().splitlines() == [
        "... 2 purged so far", "... 4 purged so far", "... 5 purged so far",
        "Purged 5 expired job rows.",
    ]
    assert "\r" not in out.getvalue()
    assert not Job.objects.exists()


def test_purge_command_can_also_purge_old_dead_letters():
    dead_letter(10 * 24 * HOUR)
    dead_letter(HOUR)
    out = io.StringIO()
    call_command("soniq_purge", "--dead-letters-older-than", "7", stdout=out)
    assert out.getvalue().splitlines() == [
        "Purged 0 expired job rows.", "Purged 1 dead letters older than 7 days.",
    ]
    assert DeadLetterJob.objects.count() == 1


@pytest.mark.parametrize("argv", [["--batch", "0"], ["--database", "nowhere"]])
def test_purge_command_failures_are_command_errors(argv):
    with pytest.raises(CommandError):
        call_command("soniq_purge", *argv, stdout=io.StringIO())


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_the_settle_of_lapsed_leases_waits_no_longer_than_its_bound():
    """The worker's housekeeping settles lapsed leases on its shared connection, between
    lease renewals: a table lock held elsewhere ends the call at its bound (lock_timeout,
    55P03, raised as QUEUE_PERSISTENCE_FAILED: nothing settled), instead of holding the turn as long as the lock is held."""
    import threading
    import time

    from soniq_django.errors import ErrorCode, SoniqError
    from soniq_django.housekeeping import settle_lapsed
    from tests.support.sql import raw

    with raw(autocommit=False) as holder:
        holder.execute("LOCK TABLE soniq_jobs IN ACCESS EXCLUSIVE MODE")
        release = threading.Timer(5, holder.rollback)
        release.start()
        began = time.monotonic()
        try:
            with pytest.raises(SoniqError) as raised:
                settle_lapsed("default", 300.0, lock_wait=0.2)
            waited = time.monotonic() - began
        finally:
            release.cancel()
            holder.rollback()
    assert waited < 2, waited
    assert raised.value.code == ErrorCode.QUEUE_PERSISTENCE_FAILED  # 55P03: try again later
