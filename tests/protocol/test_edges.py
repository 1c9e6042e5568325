"""The claim protocol where it meets uniqueness, the dead letters and the worker's bookkeeping.

One test (or a few) per defect of issue 11, on both databases unless the
behaviour exists on one only. Each failed on the code before migration 0011
(claim protocol v3, producer API v3) and the fixes that came with it; the
rules they hold are in docs/claim-protocol.md ("Edges").
"""

import datetime as dt
import uuid

import pytest
from django.utils import timezone

from soniq_django import bulk_enqueue, enqueue, get_job
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.producer.request import JobRequest
from soniq_django.models import DeadLetterJob, Job, TaskRegistration
from soniq_django.owned import OwnedJobSource
from soniq_django.owned.types import ClaimedJob
from soniq_django.worker.context import JobContext
from soniq_django.worker.flight import InFlight
from soniq_django.worker.loop import Worker
from tests.support.owned import claim, nonce, refuse_updates, rewrite

pytestmark = pytest.mark.django_db


@pytest.fixture
def source():
    return OwnedJobSource()


def lapse(job_id) -> None:
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))


TWINS = {
    "unique": {"unique_job": True},
    "dedup": {"dedup_key": "invoice-1"},
}


# 1. A retry whose queued slot a twin holds --------------------------------------


@pytest.mark.parametrize("key", TWINS)
def test_a_retry_whose_key_a_queued_twin_holds_is_finished_as_superseded(source, key):
    first = enqueue("billing.send_invoice", {"order_id": 1}, **TWINS[key])
    fence = claim(source).claim_fence
    twin = enqueue("billing.send_invoice", {"order_id": 1}, **TWINS[key])
    assert twin != first  # keys match queued rows only

    assert source.fail_owned(fence, "boom", retry=True, retry_delay=0) is True

    row = Job.objects.get(id=first)
    assert (row.status, row.lease_expires_at, row.pid) == ("cancelled", None, None)
    assert row.last_error.startswith(f"superseded: not queued again because queued job {twin}")
    assert row.last_error.endswith("this attempt ended with: boom")
    assert row.expires_at > timezone.now()
    assert get_job(first).status == "cancelled"
    assert Job.objects.get(id=twin).status == "queued"
    # The queue goes on: the twin is the next job.
    assert claim(source, "worker-2").job_id == twin


@pytest.mark.parametrize("key", TWINS)
def test_a_lapsed_claim_whose_key_a_queued_twin_holds_never_stops_claiming(source, key):
    first = enqueue("billing.send_invoice", {"order_id": 1}, **TWINS[key])
    claim(source)
    twin = enqueue("billing.send_invoice", {"order_id": 1}, **TWINS[key])
    lapse(first)

    # The claim runs the reaper first: it must settle the row and go on.
    assert claim(source, "worker-2").job_id == twin
    row = Job.objects.get(id=first)
    assert row.status == "cancelled"
    assert row.last_error.startswith(f"superseded: not queued again because queued job {twin}")
    assert "lease lapsed" in row.last_error
    assert source.claim_next_owned("worker-3", claim_token=nonce()) is None


def test_a_claim_many_also_reaps_a_superseded_row(source):
    first = enqueue("billing.send_invoice", {"order_id": 1}, dedup_key="k")
    claim(source)
    twin = enqueue("billing.send_invoice", {"order_id": 2}, dedup_key="k")
    lapse(first)
    claimed = source.claim_many_owned("worker-2", claim_tokens=[nonce(), nonce()])
    assert [job.job_id for job in claimed] == [twin]
    assert Job.objects.get(id=first).status == "cancelled"


def _refuse_updates_of(job_id) -> None:
    """Make every UPDATE of this one row fail (a hostile schema)."""
    refuse_updates(f"OLD.id = '{job_id}'", f"OLD.id = '{uuid.UUID(str(job_id)).hex}'")


def test_one_lapsed_row_the_reaper_cannot_settle_never_fails_a_claim(source):
    bad = enqueue("a.bad", priority=1)
    claim(source)
    good = enqueue("a.good")
    lapse(bad)
    _refuse_updates_of(bad)

    assert claim(source, "worker-2").job_id == good  # the bad row is skipped, not fatal
    assert Job.objects.get(id=bad).status == "processing"  # left for later


def test_a_refusal_is_not_reported_as_an_outage(source):
    job_id = enqueue("a.job")
    _refuse_updates_of(job_id)
    with pytest.raises(SoniqError) as raised:
        source.claim_next_owned("w", claim_token=nonce())
    assert raised.value.code is ErrorCode.QUEUE_DATABASE_REFUSED
    assert "SQLSTATE" in raised.value.reason
    assert str(job_id) not in str(raised.value)


# 2. An id held by a dead letter is taken --------------------------------------------


def _dead_letter(job_id=None, **values) -> uuid.UUID:
    job_id = job_id or uuid.uuid4()
    DeadLetterJob.objects.create(
        id=job_id, job_name="billing.send_invoice", args={}, attempts=1, max_attempts=1,
        dead_letter_reason="permanent_failure", moved_to_dead_letter_at=timezone.now(), **values)
    return job_id


def test_enqueue_refuses_an_id_the_dead_letters_hold():
    job_id = _dead_letter()
    with pytest.raises(SoniqError) as raised:
        enqueue("billing.send_invoice", job_id=job_id)
    assert raised.value.code is ErrorCode.DUPLICATE_JOB_ID
    with pytest.raises(SoniqError) as raised:
        bulk_enqueue([JobRequest("billing.send_invoice", job_id=job_id)])
    assert raised.value.code is ErrorCode.DUPLICATE_JOB_ID
    with pytest.raises(SoniqError) as raised:
        bulk_enqueue([JobRequest("billing.send_invoice", job_id=job_id, dedup_key="d")])
    assert raised.value.code is ErrorCode.DUPLICATE_JOB_ID
    assert not Job.objects.exists()


def test_submit_owned_refuses_an_id_the_dead_letters_hold(source):
    job_id = _dead_letter()
    with pytest.raises(SoniqError) as raised:
        source.submit_owned(JobRequest("billing.send_invoice", job_id=job_id),
                            submission_id="s-new")
    assert raised.value.code is ErrorCode.QUEUE_SUBMISSION_CONFLICT


@pytest.mark.postgresql_only
def test_the_sql_functions_refuse_an_id_the_dead_letters_hold():
    from tests.support.sql import fails

    job_id = _dead_letter()
    error = fails("SELECT soniq_enqueue('billing.send_invoice', job_id => %s)", [job_id])
    assert (error.sqlstate, error.diag.constraint_name) == ("23505", "soniq_dead_letter_jobs_pkey")
    error = fails("SELECT soniq_enqueue_many(%s::jsonb)",
                  [f'[{{"job_name": "a.b"}}, {{"job_name": "a.b", "job_id": "{job_id}"}}]'])
    assert (error.sqlstate, error.diag.constraint_name) == ("23505", "soniq_dead_letter_jobs_pkey")
    assert not Job.objects.exists()


def test_the_dead_letter_move_never_replaces_a_protected_identity(source):
    original = source.submit_owned(JobRequest("billing.send_invoice", args={"n": 1}),
                                   submission_id="s-1")
    fence = claim(source).claim_fence
    assert source.fail_owned(fence, "no", retry=False) is True
    kept = DeadLetterJob.objects.get(id=original)
    assert kept.submission_id == "s-1"
    # A second job under the same id (written behind the API's back, as an
    # old release or a raw INSERT could) is dead-lettered too.
    Job.objects.create(id=original, job_name="billing.other", args={})
    fence = claim(source).claim_fence
    assert source.fail_owned(fence, "no again", retry=False) is True

    letter = DeadLetterJob.objects.get(id=original)
    assert (letter.submission_id, letter.submission_fingerprint, letter.fence_required) == (
        "s-1", kept.submission_fingerprint, True)
    # The original submission still replays to its id, and nothing runnable appears.
    assert source.submit_owned(JobRequest("billing.send_invoice", args={"n": 1}),
                               submission_id="s-1") == original
    assert not Job.objects.exists()


# 3. Two runs of one job in one worker ---------------------------------------------


def _flight(job_id: uuid.UUID, generation: int) -> InFlight:
    from soniq_django.owned.types import QueueClaimFence

    fence = QueueClaimFence(queue="default", job_id=str(job_id), worker_id="w",
                            generation=generation, claim_token=nonce())
    claimed = ClaimedJob(job_id=job_id, job_name="a.job", args={}, queue="default", priority=100,
                         attempts=generation, max_attempts=4, lease_expires_at=timezone.now(),
                         claim_fence=fence)
    return InFlight(claimed, JobContext(job_id=str(job_id), job_name="a.job", queue="default",
                                        attempts=generation, max_attempts=4))


def test_each_claim_of_a_job_has_its_own_flight():
    flights = Worker().flights
    job_id = uuid.uuid4()
    late, current = _flight(job_id, 1), _flight(job_id, 2)
    flights.track(late.claimed)
    tracked = flights.track(current.claimed)
    assert len(flights) == 2
    stale = next(f for f in flights.all() if f.key == (str(job_id), 1))
    flights.finish(stale)  # the lapsed run's handler returns late
    assert flights.all() == [tracked]  # the live run keeps heartbeats
    flights.finish(stale)  # finishing twice removes nothing else
    assert flights.all() == [tracked]


# 4. Lapsed claims of a job with max_attempts NULL -------------------------------------


def _lapse_until_gone(source, job_id, limit=20) -> int:
    """Claim and lapse the job until it leaves soniq_jobs; return how many claims it took."""
    for claims in range(1, limit + 1):
        claimed = source.claim_next_owned("w", claim_token=nonce())
        if claimed is None:  # the claim's reaper moved it
            return claims - 1
        assert claimed.job_id == job_id
        lapse(job_id)
    raise AssertionError("the job kept being re-queued")


def test_lapsed_claims_of_a_null_max_attempts_job_end_in_the_dead_letters(source):
    job_id = enqueue("a.crashes_its_worker", max_attempts=None)
    assert _lapse_until_gone(source, job_id) == 4  # the format-1 default
    letter = DeadLetterJob.objects.get(id=job_id)
    assert (letter.dead_letter_reason, letter.attempts) == ("max_retries_exceeded", 4)


def test_lapsed_claims_count_against_the_handlers_registered_limit(source):
    TaskRegistration.objects.create(task_name="a.crashes_its_worker", worker_id="w1",
                                    max_attempts=2)
    TaskRegistration.objects.create(task_name="a.crashes_its_worker", worker_id="w2",
                                    max_attempts=None)
    job_id = enqueue("a.crashes_its_worker", max_attempts=None)
    assert _lapse_until_gone(source, job_id) == 2
    assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "max_retries_exceeded"


# 5. server_side_binding ----------------------------------------------------------------


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True, databases=["default", "server_binding"])
def test_batched_rounds_work_with_server_side_binding():
    # tests/settings.py: the same database, with OPTIONS["server_side_binding"].
    bound = OwnedJobSource(using="server_binding")
    first, second = enqueue("a.one", priority=1), enqueue("a.two", priority=2)
    fence = bound.claim_next_owned("w", claim_token=nonce()).claim_fence
    completed, claimed = bound.complete_many_and_claim_owned(
        [(fence, {"ok": True})], claim_tokens=[nonce()])
    assert completed == [True] and [job.job_id for job in claimed] == [second]
    assert Job.objects.get(id=first).status == "done"


# 6. request_cancel -------------------------------------------------------------------------


def test_request_cancel_of_an_unknown_id_is_false(source):
    assert source.request_cancel(uuid.uuid4()) is False


def test_request_cancel_of_a_lapsed_claim_cancels_it_at_once(source):
    job_id = enqueue("a.job")
    claimed = claim(source)
    lapse(job_id)
    assert source.request_cancel(job_id) is True
    row = Job.objects.get(id=job_id)
    assert (row.status, row.lease_expires_at) == ("cancelled", None)
    assert row.expires_at > timezone.now()
    assert source.complete_owned(claimed.claim_fence) is False


@pytest.mark.postgresql_only
def test_soniq_request_cancel_of_an_unknown_id_is_false():
    from tests.support.sql import fetch

    assert fetch("SELECT soniq_request_cancel(gen_random_uuid())") == [(False,)]


# 7. A forced replacement's predecessor -------------------------------------------------------


def test_a_forced_replacements_predecessor_stays_readable_for_the_result_ttl(source):
    first = source.submit_owned(JobRequest("a.stream", active_key="k"), submission_id="s1")
    source.submit_owned(JobRequest("a.stream", args={"v": 2}, active_key="k"),
                        submission_id="s2", force=True)
    info = get_job(first)
    assert info is not None and info.status == "cancelled"
    assert Job.objects.get(id=first).expires_at > timezone.now() + dt.timedelta(seconds=200)
