"""Dead-letter replay: back to queued with a fresh budget, counted, never doubled."""

import datetime as dt
import io
import json
import threading
import uuid

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections, transaction
from django.utils import timezone

from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.housekeeping import purge_expired
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import JobRequest, OwnedJobSource
from soniq_django.replay import GENERATION_STRIDE, replay_dead_letters
from tests.support.concurrency import run_threads
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db

OLD_ARGS = {"when": "2024-01-01 00:00:00+00:00", "amount": 1.5, "ids": [3, 1, 2], "note": None}
SECRET = "s3cret-card-4242"


def dead_letter(reason="max_retries_exceeded", **values) -> DeadLetterJob:
    """A dead letter as an older worker would have left it."""
    row = dict(
        id=uuid.uuid4(), job_name="billing.send_invoice", args={"order_id": 7}, queue="billing",
        priority=5, max_attempts=3, attempts=3, last_error="Traceback: boom",
        dead_letter_reason=reason, original_created_at=timezone.now() - dt.timedelta(days=2),
        moved_to_dead_letter_at=timezone.now() - dt.timedelta(days=1),
    )
    return DeadLetterJob.objects.create(**{**row, **values})


def raw_args(job_id) -> str:
    """The args column exactly as the database holds it (canonical text on PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT args FROM soniq_jobs WHERE id = %s",
            [Job._meta.pk.get_db_prep_value(job_id, connection)],
        )
        return cursor.fetchone()[0]


def raw_dead_args(job_id) -> str:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT args FROM soniq_dead_letter_jobs WHERE id = %s",
            [DeadLetterJob._meta.pk.get_db_prep_value(job_id, connection)],
        )
        return cursor.fetchone()[0]


def owned_dead_letter(submission_id="sub-1", args=None):
    """An owned submission that failed for good through the owned API.

    Returns (request, job id, the fence of the failed claim).
    """
    source = OwnedJobSource()
    request = JobRequest("billing.send_invoice", args or {"order_id": 9}, max_attempts=2)
    job_id = source.submit_owned(request, submission_id=submission_id)
    claimed = source.claim_next_owned("worker-1", claim_token=nonce())
    assert claimed.job_id == job_id
    assert source.fail_owned(claimed.claim_fence, "boom", retry=False)
    assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "permanent_failure"
    return request, job_id, claimed.claim_fence


# What a replay writes ---------------------------------------------------------


def test_replay_by_id_requeues_the_job_and_counts_the_resurrection():
    dead = dead_letter(args=OLD_ARGS)
    before = timezone.now()
    report = replay_dead_letters(ids=[dead.id])
    after = timezone.now()
    assert report.replayed == (dead.id,) and report.skipped == 0 and not report.dry_run

    job = Job.objects.get(id=dead.id)
    assert (job.job_name, job.queue, job.priority, job.status) == (
        "billing.send_invoice", "billing", 5, "queued")
    assert (job.attempts, job.max_attempts) == (0, 3)  # a fresh budget of the same size
    assert job.args == OLD_ARGS  # the stringified datetime stays a plain string
    assert raw_args(dead.id) == raw_dead_args(dead.id)  # copied byte for byte
    assert before - dt.timedelta(seconds=5) <= job.scheduled_at <= after + dt.timedelta(seconds=5)
    assert job.created_at == dead.original_created_at
    assert (job.fence_required, job.submission_id, job.claim_token) == (False, None, None)
    assert job.expires_at is None and job.result is None and job.worker_id is None

    dead.refresh_from_db()
    assert dead.resurrection_count == 1
    assert dead.last_resurrection_at is not None
    assert dead.last_resurrection_at >= dead.moved_to_dead_letter_at
    assert dead.args == OLD_ARGS and dead.dead_letter_reason == "max_retries_exceeded"


def test_a_null_max_attempts_stays_null():
    dead = dead_letter(max_attempts=None)
    replay_dead_letters(ids=[str(dead.id)])
    assert Job.objects.get(id=dead.id).max_attempts is None


def test_the_replayed_job_is_claimable_at_once_with_a_fresh_attempt_budget():
    dead = dead_letter(max_attempts=2)
    replay_dead_letters(ids=[dead.id])
    source = OwnedJobSource()
    first = source.claim_next_owned("worker-1", claim_token=nonce())
    assert first.job_id == dead.id and first.attempts == 1 and first.args == {"order_id": 7}
    assert source.fail_owned(first.claim_fence, "again", retry=True, retry_delay=0)
    second = source.claim_next_owned("worker-1", claim_token=nonce())
    assert second.attempts == 2
    assert source.fail_owned(second.claim_fence, "again", retry=True, retry_delay=0)
    # Out of attempts: back in the dead letters; the same row, count kept.
    again = DeadLetterJob.objects.get(id=dead.id)
    assert (again.dead_letter_reason, again.attempts, again.resurrection_count) == (
        "max_retries_exceeded", 2, 1)
    assert not Job.objects.filter(id=dead.id).exists()


def test_replay_by_reason_and_all():
    retried = [dead_letter("max_retries_exceeded"), dead_letter("max_retries_exceeded")]
    permanent = dead_letter("permanent_failure")
    report = replay_dead_letters(reason="max_retries_exceeded")
    assert set(report.replayed) == {d.id for d in retried}
    assert not Job.objects.filter(id=permanent.id).exists()

    report = replay_dead_letters(all=True)
    assert report.replayed == (permanent.id,)
    assert set(report.live) == {d.id for d in retried}
    assert Job.objects.count() == 3
    assert set(DeadLetterJob.objects.values_list("resurrection_count", flat=True)) == {1}


def test_dry_run_counts_without_writing():
    dead = [dead_letter() for _ in range(3)]
    Job.objects.create(id=dead[0].id, job_name="billing.send_invoice")  # already live
    report = replay_dead_letters(all=True, dry_run=True)
    assert report.dry_run
    assert set(report.replayed) == {dead[1].id, dead[2].id}
    assert report.live == (dead[0].id,)
    assert Job.objects.count() == 1
    assert set(DeadLetterJob.objects.values_list("resurrection_count", flat=True)) == {0}
    assert not DeadLetterJob.objects.filter(last_resurrection_at__isnull=False).exists()


def test_a_job_already_live_is_skipped_and_reported():
    dead = dead_letter()
    Job.objects.create(id=dead.id, job_name="billing.send_invoice", args={"other": True})
    report = replay_dead_letters(ids=[dead.id])
    assert report.replayed == () and report.live == (dead.id,)
    assert Job.objects.get(id=dead.id).args == {"other": True}
    assert DeadLetterJob.objects.get(id=dead.id).resurrection_count == 0


def test_replaying_twice_runs_the_job_once_until_it_fails_again():
    dead = dead_letter()
    assert replay_dead_letters(ids=[dead.id]).replayed == (dead.id,)
    source = OwnedJobSource()
    claimed = source.claim_next_owned("worker-1", claim_token=nonce())
    assert source.complete_owned(claimed.claim_fence, {"sent": True})
    Job.objects.filter(id=dead.id).delete()  # its result expired and was purged
    # Replayed and not failed since: replaying again would re-run finished work.
    report = replay_dead_letters(all=True)
    assert report.replayed == () and report.already_replayed == (dead.id,)
    assert DeadLetterJob.objects.get(id=dead.id).resurrection_count == 1


def test_unknown_ids_are_reported_missing():
    dead = dead_letter()
    unknown = uuid.uuid4()
    report = replay_dead_letters(ids=[unknown, dead.id, dead.id])
    assert report.missing == (unknown,) and report.replayed == (dead.id,)


@pytest.mark.parametrize("selector", [
    {}, {"ids": [uuid.uuid4()], "all": True}, {"reason": "x", "all": True},
    {"ids": [uuid.uuid4()], "reason": "x"}, {"ids": []}, {"reason": ""},
    {"ids": ["not-a-uuid"]}, {"ids": str(uuid.uuid4())}, {"all": 1},
])
def test_exactly_one_valid_selector_is_required(selector):
    with pytest.raises(ValueError):
        replay_dead_letters(**selector)


# Owned submissions -------------------------------------------------------------


def test_an_owned_replay_keeps_returning_the_same_id_across_a_dead_letter_replay():
    request, job_id, _ = owned_dead_letter()
    source = OwnedJobSource()
    assert source.submit_owned(request, submission_id="sub-1") == job_id

    assert replay_dead_letters(ids=[job_id]).replayed == (job_id,)
    job = Job.objects.get(id=job_id)
    dead = DeadLetterJob.objects.get(id=job_id)
    assert job.fence_required and job.submission_id == "sub-1"
    assert job.submission_fingerprint == dead.submission_fingerprint is not None
    assert (job.status, job.attempts, job.max_attempts) == ("queued", 0, 2)

    # While queued again, and after failing again, the exact request maps to the job.
    assert source.submit_owned(request, submission_id="sub-1") == job_id
    changed = JobRequest("billing.send_invoice", {"order_id": 10}, max_attempts=2)
    with pytest.raises(SoniqError) as error:
        source.submit_owned(changed, submission_id="sub-1")
    assert error.value.code == ErrorCode.QUEUE_SUBMISSION_CONFLICT

    claimed = source.claim_next_owned("worker-2", claim_token=nonce())
    assert claimed.job_id == job_id
    assert source.fail_owned(claimed.claim_fence, "boom again", retry=False)
    dead.refresh_from_db()
    assert (dead.resurrection_count, dead.last_error) == (1, "boom again")
    assert dead.submission_id == "sub-1" and dead.fence_required
    assert source.submit_owned(request, submission_id="sub-1") == job_id

    assert replay_dead_letters(ids=[job_id]).replayed == (job_id,)
    dead.refresh_from_db()
    assert dead.resurrection_count == 2


def test_a_fence_from_before_the_replay_never_matches_the_new_incarnation():
    _, job_id, old_fence = owned_dead_letter()
    replay_dead_letters(ids=[job_id])
    assert Job.objects.get(id=job_id).claim_generation == GENERATION_STRIDE
    source = OwnedJobSource()
    # Even a worker that (wrongly) reuses its old owner and nonce gets a new generation.
    claimed = source.claim_next_owned(old_fence.worker_id, claim_token=old_fence.claim_token)
    assert claimed.job_id == job_id
    assert claimed.claim_fence.generation == GENERATION_STRIDE + 1 > old_fence.generation
    assert not source.complete_owned(old_fence, {"late": True})
    assert not source.heartbeat_owned(old_fence)
    assert Job.objects.get(id=job_id).status == "processing"
    assert source.complete_owned(claimed.claim_fence, {"ok": True})


def test_replayed_owned_jobs_stay_protected_from_housekeeping():
    _, job_id, _ = owned_dead_letter()
    replay_dead_letters(ids=[job_id])
    source = OwnedJobSource()
    claimed = source.claim_next_owned("worker-1", claim_token=nonce())
    assert source.complete_owned(claimed.claim_fence, None)
    assert purge_expired(now=timezone.now() + dt.timedelta(days=1)) == 0
    assert Job.objects.filter(id=job_id).exists()


# Concurrency ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_replays_never_double_a_job():
    dead = [dead_letter() for _ in range(20)]
    reports = run_threads(lambda _: replay_dead_letters(all=True), 4)
    replayed = [i for report in reports for i in report.replayed]
    assert sorted(replayed) == sorted(d.id for d in dead)  # each exactly once
    assert Job.objects.count() == 20
    assert set(DeadLetterJob.objects.values_list("resurrection_count", flat=True)) == {1}


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_replay_waits_for_the_dead_letter_lock_then_sees_the_job_live():
    dead = dead_letter()
    holding, release = threading.Event(), threading.Event()
    outcome = {}

    def first():
        try:
            with transaction.atomic():
                list(DeadLetterJob.objects.select_for_update().filter(id=dead.id))
                holding.set()
                release.wait(10)
                outcome["first"] = replay_dead_letters(ids=[dead.id])
        finally:
            connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(10)
    second = {}

    def other():
        try:
            second["report"] = replay_dead_letters(ids=[dead.id])
        finally:
            connections.close_all()

    waiter = threading.Thread(target=other)
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive()  # blocked on the dead letter's row lock
    release.set()
    thread.join(10)
    waiter.join(10)
    assert outcome["first"].replayed == (dead.id,)
    assert second["report"].live == (dead.id,) and second["report"].replayed == ()
    assert DeadLetterJob.objects.get(id=dead.id).resurrection_count == 1


@pytest.mark.postgresql_only
def test_dead_letter_table_has_no_trigger_that_could_skip_the_count():
    # Only a BEFORE (bit 1) or INSTEAD OF (bit 6) trigger can skip a row; the
    # AFTER triggers -- the attempt history's, the trace contexts', the waiters'
    # notice (0024), the progress rows', the workflow rows' (0026) and the steps' purge
    # (0028) -- cannot.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal"
            " AND tgrelid = 'soniq_dead_letter_jobs'::regclass AND tgtype & (2 | 64) <> 0"
        )
        assert cursor.fetchone()[0] == 0
        cursor.execute(
            "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
            " AND tgrelid = 'soniq_dead_letter_jobs'::regclass ORDER BY tgname")
        assert cursor.fetchall() == [("soniq_attempts_dead_letter_gone",),
                                     ("soniq_job_dead_lettered",),
                                     ("soniq_job_progress_dead_letter_gone",),
                                     ("soniq_job_steps_dead_letter_gone",),
                                     ("soniq_job_trace_dead_letter_gone",),
                                     ("soniq_workflow_dead_letter_gone",)]


# The command --------------------------------------------------------------------


def test_replay_command_by_id_prints_counts_never_args():
    dead = dead_letter(args={"card": SECRET, **OLD_ARGS})
    out = io.StringIO()
    call_command("soniq_replay", str(dead.id), stdout=out)
    text = out.getvalue()
    assert text.splitlines() == [
        "... 1 dead letters handled",
        "Replayed 1 dead-lettered jobs.",
        "Skipped 0 already in the queue, 0 replayed and not failed since, "
        "0 refused by a constraint; 0 ids not found.",
    ]
    assert SECRET not in text and json.dumps(OLD_ARGS) not in text
    assert Job.objects.get(id=dead.id).args == {"card": SECRET, **OLD_ARGS}


def with_id(text: str) -> uuid.UUID:
    """A dead letter whose id starts with ``text`` (hex digits)."""
    job_id = uuid.UUID(text + uuid.uuid4().hex[len(text):])
    return dead_letter(id=job_id).id


def test_replay_command_takes_the_short_id_the_admin_shows():
    first, other = with_id("3f9a1b2c"), with_id("77aa0000")
    out = io.StringIO()
    call_command("soniq_replay", "3f9a1b2c", str(other)[:13].upper(), stdout=out)
    assert "Replayed 2 dead-lettered jobs." in out.getvalue()
    assert set(Job.objects.values_list("id", flat=True)) == {first, other}


@pytest.mark.parametrize(("argv", "needle"), [
    (["3f9a1b2c"], "3f9a1b2c is the start of 2 dead letters' ids: give more of the id"),
    (["0badc0de"], "no dead letter has the id 0badc0de"),
    ([str(uuid.UUID(int=5))], f"no dead letter has the id {uuid.UUID(int=5)}"),
    (["3f9a1b2"], "'3f9a1b2' is neither a job id nor its first 8 or more hex digits"),
    (["3f9a-1b2c"], "'3f9a-1b2c' is neither a job id"),
    (["not-a-uuid"], "'not-a-uuid' is neither a job id"),
])
def test_replay_command_refuses_ids_that_are_not_exactly_one_dead_letter(argv, needle):
    with_id("3f9a1b2c0")
    with_id("3f9a1b2c1")
    kept = with_id("12345678")
    with pytest.raises(CommandError) as caught:
        # The good id is not replayed either: nothing is changed.
        call_command("soniq_replay", str(kept), *argv, stdout=io.StringIO())
    assert needle in str(caught.value) and "Nothing was changed." in str(caught.value)
    assert not Job.objects.exists()


def test_an_unknown_reason_is_refused_listing_the_reasons():
    dead_letter("max_retries_exceeded")
    dead_letter("quota_exhausted")  # written by another release's or language's worker
    with pytest.raises(ValueError) as caught:
        replay_dead_letters(reason="max_retries_exceded")
    assert str(caught.value) == (
        "reason must be one of the dead-letter reasons: invalid_arguments, job_not_found, "
        "max_retries_exceeded, permanent_failure, quota_exhausted")
    with pytest.raises(CommandError, match="reason must be one of the dead-letter reasons: "
                                           "invalid_arguments, job_not_found"):
        call_command("soniq_replay", "--reason", "typo", stdout=io.StringIO())
    assert not Job.objects.exists()
    assert replay_dead_letters(reason="quota_exhausted").replayed  # one that exists
    assert replay_dead_letters(reason="job_not_found").replayed == ()  # soniq's, none now


def test_replay_command_reason_all_and_dry_run():
    dead_letter("permanent_failure")
    dead_letter("max_retries_exceeded")
    out = io.StringIO()
    call_command("soniq_replay", "--all", "--dry-run", stdout=out)
    assert "\nWould replay 2 dead-lettered jobs.\n" in out.getvalue()
    assert not Job.objects.exists()

    out = io.StringIO()
    call_command("soniq_replay", "--reason", "max_retries_exceeded", stdout=out)
    assert "\nReplayed 1 dead-lettered jobs.\n" in out.getvalue()

    out = io.StringIO()
    call_command("soniq_replay", "--all", stdout=out)
    assert out.getvalue().splitlines() == [
        "... 2 dead letters handled",
        "Replayed 1 dead-lettered jobs.",
        "Skipped 1 already in the queue, 0 replayed and not failed since, "
        "0 refused by a constraint; 0 ids not found.",
    ]


@pytest.mark.parametrize("argv", [
    [], ["--all", str(uuid.uuid4())], ["--all", "--reason", "permanent_failure"],
    ["not-a-uuid"], ["--all", "--database", "nowhere"],
])
def test_replay_command_failures_are_command_errors(argv):
    with pytest.raises(CommandError):
        call_command("soniq_replay", *argv, stdout=io.StringIO())


def test_replay_reports_progress_as_plain_lines_when_not_a_terminal():
    import io

    from django.core.management import call_command

    for _ in range(3):
        DeadLetterJob.objects.create(id=uuid.uuid4(), job_name="a.dead", args={},
                                     dead_letter_reason="permanent_failure")
    out = io.StringIO()
    call_command("soniq_replay", "--all", stdout=out)
    lines = out.getvalue().splitlines()
    assert "... 3 dead letters handled" in lines
    assert any(line.startswith("Replayed 3") for line in lines)


# What the dashboard counts ----------------------------------------------------


def test_a_replayed_job_counts_once_on_the_dashboard_until_it_fails_again():
    from soniq_django.overview import queue_summary

    dead, other = dead_letter(), dead_letter(reason="permanent_failure")

    def counted():
        summary = queue_summary()
        cells = summary["queues"]["billing"]
        return cells["queued"], cells["dead_letter"], summary["dead_letters_by_reason"]

    assert counted() == (0, 2, {"max_retries_exceeded": 1, "permanent_failure": 1})
    replay_dead_letters(ids=[dead.id])
    # Back in the queue: queued, and no longer a dead letter (its row stays, for the count).
    assert counted() == (1, 1, {"permanent_failure": 1})
    source = OwnedJobSource()
    claimed = source.claim_next_owned("worker-1", claim_token=nonce())
    assert claimed.job_id == dead.id
    assert source.fail_owned(claimed.claim_fence, "boom again", retry=False,
                             dead_letter_reason="permanent_failure")
    assert counted() == (0, 2, {"permanent_failure": 2})
