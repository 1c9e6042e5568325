"""Owned claims and fenced writes, on both databases (the seed's rules, one test each)."""

import asyncio
import dataclasses
import datetime as dt
import time
import uuid

import pytest
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.errors import ConfigValidationError, ErrorCode, SoniqError
from soniq_django.models import DeadLetterJob, Job, Worker
from soniq_django.owned import OwnedJobSource, OwnedJobState, QueueClaimFence
from tests.support.owned import claim, nonce, rewrite, row_locked

pytestmark = pytest.mark.django_db


@pytest.fixture
def source():
    return OwnedJobSource()


# Claims -------------------------------------------------------------------


def test_claim_returns_the_job_and_a_fence(source):
    job_id = enqueue("billing.send_invoice", {"order_id": 7}, queue="billing", priority=5)
    token = nonce()
    claimed = source.claim_next_owned("worker-1", claim_token=token)
    assert claimed.job_id == job_id and claimed.job_name == "billing.send_invoice"
    assert (claimed.args, claimed.queue, claimed.priority, claimed.attempts) == (
        {"order_id": 7}, "billing", 5, 1,
    )
    assert claimed.lease_expires_at > timezone.now()
    assert claimed.claim_fence == QueueClaimFence(
        queue="billing", job_id=str(job_id), worker_id="worker-1", generation=1,
        claim_token=token,
    )
    row = Job.objects.get(id=job_id)
    assert (row.status, row.claim_owner, row.claim_token, row.claim_generation) == (
        "processing", "worker-1", token, 1,
    )


def test_nothing_eligible_returns_none(source):
    assert source.claim_next_owned("w", claim_token=nonce()) is None
    enqueue("a.later", run_at=timezone.now() + dt.timedelta(hours=1))
    assert source.claim_next_owned("w", claim_token=nonce()) is None


def test_claims_follow_priority_then_age_and_respect_queues(source):
    low = enqueue("a.low", priority=200)
    first = enqueue("a.first", priority=10)
    second = enqueue("a.second", priority=10)
    other = enqueue("a.other", queue="other", priority=1)
    assert claim(source, queues=["default"]).job_id == first
    assert claim(source, queues=["default"]).job_id == second
    assert claim(source, queues=["default"]).job_id == low
    assert source.claim_next_owned("w", claim_token=nonce(), queues=["default"]) is None
    assert claim(source).job_id == other


def test_a_stored_nonce_raises_claim_conflict(source):
    enqueue("a.one")
    enqueue("a.two")
    token = nonce()
    source.claim_next_owned("worker-1", claim_token=token)
    with pytest.raises(SoniqError) as caught:
        source.claim_next_owned("worker-1", claim_token=token)
    assert caught.value.code is ErrorCode.QUEUE_CLAIM_CONFLICT
    assert caught.value.reason == "nonce_reused"
    assert token not in str(caught.value) and token not in repr(caught.value)
    assert Job.objects.filter(status="queued").count() == 1


def test_a_nonce_stays_used_after_the_job_finished(source):
    enqueue("a.one")
    enqueue("a.two")
    token = nonce()
    claimed = source.claim_next_owned("worker-1", claim_token=token)
    assert source.complete_owned(claimed.claim_fence)
    with pytest.raises(SoniqError) as caught:
        source.claim_next_owned("worker-2", claim_token=token)
    assert caught.value.code is ErrorCode.QUEUE_CLAIM_CONFLICT


@pytest.mark.parametrize(
    ("worker", "token"),
    [("", "t"), ("w", ""), ("w" * 256, "t"), ("w", "t" * 256), (1, "t"), ("w", None),
     ("w", b"t"), ("w\x00", "t")],
)
def test_claim_identities_are_bounded_strings(source, worker, token):
    with pytest.raises(ConfigValidationError) as caught:
        source.claim_next_owned(worker, claim_token=token)
    assert caught.value.code is ErrorCode.CONFIG


def test_identities_are_stored_exactly_as_sent(source):
    enqueue("a.one")
    owner, token = " Worker\u00e9 ", "\tToken "
    claimed = source.claim_next_owned(owner, claim_token=token)
    assert (claimed.claim_fence.worker_id, claimed.claim_fence.claim_token) == (owner, token)
    row = Job.objects.get(id=claimed.job_id)
    assert (row.claim_owner, row.claim_token) == (owner, token)


def test_generation_rises_on_every_claim_independently_of_attempts(source):
    job_id = enqueue("a.retry", max_attempts=5)
    first = claim(source)
    assert source.fail_owned(first.claim_fence, "boom", retry=True, retry_delay=0)
    rewrite(job_id, attempts=0)  # an attempt reset cannot restore an old fence
    second = claim(source, worker="worker-1")
    assert second.job_id == job_id
    assert second.claim_fence.generation == first.claim_fence.generation + 1
    assert second.attempts == 1
    assert source.heartbeat_owned(first.claim_fence) is False
    assert source.heartbeat_owned(second.claim_fence) is True


def test_a_registered_worker_owner_also_fills_worker_id(source):
    for name in ("a.one", "a.two", "a.three"):
        enqueue(name)
    worker = uuid.uuid4()
    Worker.objects.create(id=worker, hostname="h", pid=1)
    claimed = source.claim_next_owned(str(worker), claim_token=nonce())
    assert Job.objects.get(id=claimed.job_id).worker_id == worker
    unregistered = source.claim_next_owned(str(uuid.uuid4()), claim_token=nonce())
    assert Job.objects.get(id=unregistered.job_id).worker_id is None
    other = source.claim_next_owned("not-a-uuid", claim_token=nonce())
    assert Job.objects.get(id=other.job_id).worker_id is None


# Recovery -----------------------------------------------------------------


def test_recover_finds_the_live_claim_without_renewing_it(source):
    enqueue("a.one")
    enqueue("a.two")
    token = nonce()
    claimed = source.claim_next_owned("worker-1", claim_token=token)
    recovered = source.recover_owned_claim("worker-1", claim_token=token)
    assert recovered == claimed
    assert Job.objects.get(id=claimed.job_id).lease_expires_at == claimed.lease_expires_at
    assert Job.objects.filter(status="queued").count() == 1  # claimed nothing more


def test_recover_needs_the_same_owner_and_a_live_claim(source):
    enqueue("a.one")
    token = nonce()
    claimed = source.claim_next_owned("worker-1", claim_token=token)
    assert source.recover_owned_claim("worker-2", claim_token=token) is None
    assert source.recover_owned_claim("Worker-1", claim_token=token) is None
    assert source.recover_owned_claim("worker-1", claim_token=nonce()) is None
    assert source.complete_owned(claimed.claim_fence)
    assert source.recover_owned_claim("worker-1", claim_token=token) is None


# Fenced writes ------------------------------------------------------------


def test_heartbeat_renews_the_lease(source):
    enqueue("a.one")
    claimed = claim(source)
    rewrite(claimed.job_id, lease_expires_at=timezone.now() + dt.timedelta(seconds=2))
    assert source.heartbeat_owned(claimed.claim_fence) is True
    assert Job.objects.get(id=claimed.job_id).lease_expires_at > timezone.now() + dt.timedelta(
        seconds=20
    )


@pytest.mark.postgresql_only  # row locks (SQLite's write lock is waited for like any write's)
@pytest.mark.django_db(transaction=True)
def test_a_renewal_waits_for_a_row_lock_at_most_its_lock_wait(source):
    enqueue("a.one")
    claimed = claim(source)
    before = Job.objects.get(id=claimed.job_id).lease_expires_at
    with row_locked(claimed.job_id):
        started = time.monotonic()
        with pytest.raises(SoniqError) as caught:
            source.heartbeat_owned(claimed.claim_fence, lock_wait=0.2)
        waited = time.monotonic() - started
    assert (caught.value.code, caught.value.reason) == (
        ErrorCode.QUEUE_PERSISTENCE_FAILED, "lock_not_available")
    assert 0.2 <= waited < 5
    assert Job.objects.get(id=claimed.job_id).lease_expires_at == before  # nothing written
    with connection.cursor() as cursor:  # the lock_timeout was the renewal's transaction's
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"
    assert source.heartbeat_owned(claimed.claim_fence, lock_wait=0.2) is True  # free again
    assert Job.objects.get(id=claimed.job_id).lease_expires_at > before


@pytest.mark.parametrize(
    "change",
    [
        {"worker_id": "worker-2"},
        {"worker_id": "WORKER-1"},
        {"worker_id": "worker-1 "},
        {"claim_token": "other"},
        {"generation": 2},
        {"queue": "Default"},
        {"queue": "other"},
    ],
)
def test_every_fence_field_is_compared_exactly(source, change):
    enqueue("a.one")
    claimed = claim(source)
    stale = dataclasses.replace(claimed.claim_fence, **change)
    assert source.heartbeat_owned(stale) is False
    assert source.complete_owned(stale) is False
    assert source.fail_owned(stale, "x", retry=False) is False
    assert source.set_pid_owned(stale, 10) is False
    assert source.get_owned_state(stale) is None
    assert source.heartbeat_owned(claimed.claim_fence) is True
    assert Job.objects.get(id=claimed.job_id).status == "processing"


def test_a_wrong_case_job_id_refuses(source):
    enqueue("a.one")
    claimed = claim(source)
    upper = dataclasses.replace(claimed.claim_fence, job_id=claimed.claim_fence.job_id.upper())
    assert source.heartbeat_owned(upper) is False
    assert source.complete_owned(upper) is False


def test_an_invalid_uuid_job_id_raises_persistence_failed_without_changes(source):
    enqueue("a.one")
    claimed = claim(source)
    bad = dataclasses.replace(claimed.claim_fence, job_id="not-a-uuid")
    with pytest.raises(SoniqError) as caught:
        source.complete_owned(bad)
    assert caught.value.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
    assert caught.value.reason == "unavailable"
    assert "not-a-uuid" not in str(caught.value)
    assert Job.objects.get(id=claimed.job_id).status == "processing"


def test_an_unknown_job_is_false(source):
    fence = QueueClaimFence("default", str(uuid.uuid4()), "w", 1, "t")
    assert source.heartbeat_owned(fence) is False
    assert source.complete_owned(fence) is False
    assert source.get_owned_state(fence) is None


@pytest.mark.parametrize(
    "fence",
    [
        "a string",
        QueueClaimFence("q", str(uuid.uuid4()), "w", 0, "t"),
        QueueClaimFence("q", str(uuid.uuid4()), "w", True, "t"),
        QueueClaimFence("q", str(uuid.uuid4()), "w", 2**63, "t"),
        QueueClaimFence("q", str(uuid.uuid4()), "", 1, "t"),
        QueueClaimFence("q", str(uuid.uuid4()), "w", 1, ""),
        QueueClaimFence("", str(uuid.uuid4()), "w", 1, "t"),
        QueueClaimFence("q", "x" * 37, "w", 1, "t"),
    ],
)
def test_invalid_fences_raise_config(source, fence):
    with pytest.raises(ConfigValidationError):
        source.heartbeat_owned(fence)


def test_complete_applies_once(source):
    enqueue("a.one")
    claimed = claim(source)
    assert source.complete_owned(claimed.claim_fence, {"sent": True}) is True
    assert source.complete_owned(claimed.claim_fence, {"sent": True}) is False
    assert source.heartbeat_owned(claimed.claim_fence) is False
    row = Job.objects.get(id=claimed.job_id)
    assert (row.status, row.result, row.lease_expires_at, row.pid) == ("done", {"sent": True},
                                                                       None, None)
    assert row.expires_at > timezone.now() + dt.timedelta(seconds=200)


@pytest.mark.parametrize("result", [float("nan"), {"when": dt.datetime.now(dt.UTC)}, {1, 2}])
def test_results_must_be_finite_json(source, result):
    enqueue("a.one")
    claimed = claim(source)
    with pytest.raises(ConfigValidationError):
        source.complete_owned(claimed.claim_fence, result)
    assert Job.objects.get(id=claimed.job_id).status == "processing"


def test_an_expired_lease_refuses_every_write(source):
    enqueue("a.one")
    claimed = claim(source)
    rewrite(claimed.job_id, lease_expires_at=timezone.now() - dt.timedelta(milliseconds=1))
    assert source.heartbeat_owned(claimed.claim_fence) is False
    assert source.complete_owned(claimed.claim_fence) is False
    assert source.fail_owned(claimed.claim_fence, "x", retry=True) is False
    assert source.set_pid_owned(claimed.claim_fence, 5) is False
    assert source.get_owned_state(claimed.claim_fence) is None


def test_fail_with_retry_queues_again_after_a_backoff(source):
    job_id = enqueue("a.flaky", max_attempts=3)
    claimed = claim(source)
    assert source.fail_owned(claimed.claim_fence, "Traceback: boom", retry=True) is True
    row = Job.objects.get(id=job_id)
    assert (row.status, row.last_error, row.attempts, row.lease_expires_at) == (
        "queued", "Traceback: boom", 1, None,
    )
    assert row.scheduled_at > timezone.now()  # base 2 s, jitter down to half
    assert source.fail_owned(claimed.claim_fence, "again", retry=True) is False


@override_settings(SONIQ={"RETRY_BASE_SECONDS": 0})
def test_fail_without_attempts_left_dead_letters_as_max_retries_exceeded(source):
    job_id = enqueue("a.flaky", max_attempts=2)
    assert source.fail_owned(claim(source).claim_fence, "one", retry=True)
    assert source.fail_owned(claim(source).claim_fence, "two", retry=True)
    assert not Job.objects.filter(id=job_id).exists()
    dead = DeadLetterJob.objects.get(id=job_id)
    assert (dead.dead_letter_reason, dead.attempts, dead.last_error) == (
        "max_retries_exceeded", 2, "two",
    )


def test_null_max_attempts_uses_the_callers_default(source):
    job_id = enqueue("a.flaky", max_attempts=None)
    fence = claim(source).claim_fence
    assert source.fail_owned(fence, "x", retry=True, retry_delay=0, default_max_attempts=1)
    assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "max_retries_exceeded"


@pytest.mark.parametrize("reason", ["permanent_failure", "job_not_found", "invalid_arguments"])
def test_fail_without_retry_dead_letters_with_the_reason(source, reason):
    job_id = enqueue("a.broken", {"k": [1]}, queue="q", priority=3, max_attempts=4)
    fence = claim(source).claim_fence
    assert source.fail_owned(fence, "bad", retry=False, dead_letter_reason=reason,
                             dlq_record_id="rec-1") is True
    dead = DeadLetterJob.objects.get(id=job_id)
    assert (dead.dead_letter_reason, dead.args, dead.queue, dead.priority, dead.max_attempts) == (
        reason, {"k": [1]}, "q", 3, 4,
    )
    assert dead.tags == {"dlq_record_id": "rec-1"}
    assert dead.original_created_at is not None
    assert source.fail_owned(fence, "bad", retry=False) is False


@pytest.mark.parametrize(
    "kwargs",
    [{"retry": 1}, {"retry": None}, {"retry": False, "dlq_record_id": "x" * 33},
     {"retry": False, "dlq_record_id": ""}, {"retry": False, "dead_letter_reason": "other"},
     {"retry": True, "retry_delay": -1}, {"retry": True, "default_max_attempts": 0}],
)
def test_fail_arguments_are_validated(source, kwargs):
    enqueue("a.one")
    fence = claim(source).claim_fence
    with pytest.raises(ConfigValidationError):
        source.fail_owned(fence, "x", **kwargs)


def test_pid_and_state(source):
    enqueue("a.one")
    fence = claim(source).claim_fence
    assert source.get_owned_state(fence) == OwnedJobState(cancel_requested=False, pid=None)
    assert source.set_pid_owned(fence, 4242) is True
    assert source.get_owned_state(fence) == OwnedJobState(cancel_requested=False, pid=4242)
    for bad in (0, -1, 2**31, True, "12"):
        with pytest.raises(ConfigValidationError):
            source.set_pid_owned(fence, bad)


# Cancellation -------------------------------------------------------------


def test_request_cancel_on_a_queued_job_cancels_it_at_once(source):
    job_id = enqueue("a.one")
    assert source.request_cancel(job_id) is True
    assert Job.objects.get(id=job_id).status == "cancelled"
    assert source.request_cancel(job_id) is False
    assert source.request_cancel(uuid.uuid4()) is False
    assert source.claim_next_owned("w", claim_token=nonce()) is None


def test_cancel_requested_claim_heartbeats_but_refuses_final_writes(source):
    enqueue("a.one")
    claimed = claim(source)
    fence = claimed.claim_fence
    assert source.request_cancel(claimed.job_id) is True
    assert source.get_owned_state(fence) == OwnedJobState(cancel_requested=True, pid=None)
    assert source.heartbeat_owned(fence) is True
    assert source.complete_owned(fence) is False
    assert source.fail_owned(fence, "x", retry=True) is False
    assert source.set_pid_owned(fence, 3) is False
    assert source.acknowledge_cancel_owned(fence) is True
    row = Job.objects.get(id=claimed.job_id)
    assert (row.status, row.lease_expires_at, row.pid) == ("cancelled", None, None)
    assert source.acknowledge_cancel_owned(fence) is False


def test_acknowledge_needs_a_cancel_request_and_the_live_fence(source):
    enqueue("a.one")
    claimed = claim(source)
    assert source.acknowledge_cancel_owned(claimed.claim_fence) is False
    source.request_cancel(claimed.job_id)
    stale = dataclasses.replace(claimed.claim_fence, generation=2)
    assert source.acknowledge_cancel_owned(stale) is False
    assert Job.objects.get(id=claimed.job_id).status == "processing"


def test_an_expired_cancel_requested_claim_becomes_cancelled_not_runnable(source):
    job_id = enqueue("a.one")
    claimed = claim(source)
    source.request_cancel(job_id)
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert source.claim_next_owned("worker-2", claim_token=nonce()) is None
    assert Job.objects.get(id=job_id).status == "cancelled"
    assert source.acknowledge_cancel_owned(claimed.claim_fence) is False


# Lapsed leases ------------------------------------------------------------


def test_a_lapsed_claim_is_reclaimed_and_the_stale_fence_refused(source):
    job_id = enqueue("a.one")
    first = claim(source, worker="worker-1")
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    second = claim(source, worker="worker-2")
    assert second.job_id == job_id
    assert second.claim_fence.generation == first.claim_fence.generation + 1
    assert second.attempts == 2
    assert source.complete_owned(first.claim_fence, "stale") is False
    assert source.complete_owned(second.claim_fence, "fresh") is True
    assert Job.objects.get(id=job_id).result == "fresh"


def test_a_lapsed_claim_without_attempts_left_is_dead_lettered(source):
    job_id = enqueue("a.one", max_attempts=1)
    claim(source)
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert source.claim_next_owned("worker-2", claim_token=nonce()) is None
    assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "max_retries_exceeded"


# Values -------------------------------------------------------------------


def test_the_fence_is_frozen_slotted_and_hides_its_token():
    fence = QueueClaimFence("q", str(uuid.uuid4()), "w", 1, "very-secret-token")
    assert "very-secret-token" not in repr(fence) and "very-secret-token" not in str(fence)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fence.generation = 2
    assert not hasattr(fence, "__dict__")


# Async twins --------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_async_twins_do_the_same(source):
    asyncio.run(_async_twins(source))


async def _async_twins(source):
    from asgiref.sync import sync_to_async

    job_id = await sync_to_async(enqueue)("a.async")
    token = nonce()
    claimed = await source.aclaim_next_owned("worker-a", claim_token=token)
    assert claimed.job_id == job_id
    assert await source.arecover_owned_claim("worker-a", claim_token=token) == claimed
    assert await source.aheartbeat_owned(claimed.claim_fence) is True
    assert await source.aset_pid_owned(claimed.claim_fence, 12) is True
    assert await source.aget_owned_state(claimed.claim_fence) == OwnedJobState(False, 12)
    assert await source.acomplete_owned(claimed.claim_fence, [1]) is True
    second = await sync_to_async(enqueue)("a.async")
    fence = (await source.aclaim_next_owned("worker-a", claim_token=nonce())).claim_fence
    assert await source.arequest_cancel(second) is True
    assert await source.aacknowledge_cancel_owned(fence) is True
    third = await sync_to_async(enqueue)("a.async")
    fence = (await source.aclaim_next_owned("worker-a", claim_token=nonce())).claim_fence
    assert await source.afail_owned(fence, "x", retry=False) is True
    assert await sync_to_async(DeadLetterJob.objects.filter(id=third).exists)()
    await sync_to_async(connections.close_all)()  # the bridge thread's connection


def test_a_claim_can_record_the_pid(source):
    enqueue("a.one")
    claimed = source.claim_next_owned("w", claim_token=nonce(), pid=4321)
    assert source.get_owned_state(claimed.claim_fence) == OwnedJobState(False, 4321)
    for bad in (0, -5, True, "1"):
        with pytest.raises(ConfigValidationError):
            source.claim_next_owned("w", claim_token=nonce(), pid=bad)
