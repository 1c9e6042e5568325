"""Giving a claim back: ``defer_owned`` (soniq_defer on PostgreSQL, its twin on SQLite).

A worker that claimed a job it cannot run -- no handler for its name during
a rolling deploy -- queues it again for later without spending an attempt.
"""

import asyncio
import dataclasses
import datetime as dt

import pytest
from django.db import connection, connections
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.errors import ConfigValidationError
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import OwnedJobSource
from tests.support.owned import claim, nonce, rewrite

pytestmark = pytest.mark.django_db


@pytest.fixture
def source():
    return OwnedJobSource()


def test_a_deferred_job_is_queued_for_later_and_its_attempt_given_back(source):
    job_id = enqueue("rolling.new_handler", {"n": 1}, max_attempts=1)
    claimed = claim(source)
    source.set_pid_owned(claimed.claim_fence, 4242)
    before = timezone.now()
    assert source.defer_owned(claimed.claim_fence, "no handler here", delay=30) is True
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts, row.last_error) == ("queued", 0, "no handler here")
    assert (row.lease_expires_at, row.pid) == (None, None)
    assert row.claim_generation == claimed.claim_fence.generation  # stays raised
    assert before + dt.timedelta(seconds=29) < row.scheduled_at
    assert row.scheduled_at < timezone.now() + dt.timedelta(seconds=31)
    # Not due yet; and the fence owns nothing any more.
    assert source.claim_next_owned("worker-2", claim_token=nonce()) is None
    assert source.defer_owned(claimed.claim_fence, "again") is False
    assert source.complete_owned(claimed.claim_fence) is False


def test_deferrals_never_spend_the_attempts_a_handler_gets(source):
    job_id = enqueue("rolling.new_handler", max_attempts=1)
    for round_ in range(3):
        claimed = claim(source, worker=f"old-{round_}")
        assert claimed.attempts == 1  # every claim is the job's first attempt
        assert source.defer_owned(claimed.claim_fence, "not here", delay=0) is True
    again = claim(source, worker="new")
    assert (again.attempts, again.claim_fence.generation) == (1, 4)
    assert source.complete_owned(again.claim_fence, "ran") is True
    assert Job.objects.get(id=job_id).result == "ran"
    assert not DeadLetterJob.objects.exists()


def test_a_stale_expired_or_finished_fence_defers_nothing(source):
    job_id = enqueue("rolling.one")
    first = claim(source)
    stale = dataclasses.replace(first.claim_fence, generation=first.claim_fence.generation + 1)
    assert source.defer_owned(stale, "x") is False
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert source.defer_owned(first.claim_fence, "x") is False
    second = claim(source, worker="worker-2")  # the reaper re-queued the lapsed claim
    assert source.complete_owned(second.claim_fence) is True
    assert source.defer_owned(second.claim_fence, "x") is False
    row = Job.objects.get(id=job_id)
    assert (row.status, row.attempts) == ("done", 2)


def test_a_cancel_request_refuses_the_deferral(source):
    job_id = enqueue("rolling.one")
    claimed = claim(source)
    assert source.request_cancel(job_id) is True
    assert source.defer_owned(claimed.claim_fence, "x") is False
    assert Job.objects.get(id=job_id).status == "processing"
    assert source.acknowledge_cancel_owned(claimed.claim_fence) is True


def test_a_deferral_whose_unique_key_a_queued_twin_holds_is_superseded(source):
    job_id = enqueue("rolling.report", {"day": "mon"}, unique_job=True)
    claimed = claim(source)
    twin = enqueue("rolling.report", {"day": "mon"}, unique_job=True)
    assert twin != job_id  # the first one is processing: the key is free
    assert source.defer_owned(claimed.claim_fence, "not here", delay=0) is True
    row = Job.objects.get(id=job_id)
    assert row.status == "cancelled" and row.attempts == 0
    assert row.last_error.startswith(f"superseded: not queued again because queued job {twin}")
    assert row.expires_at is not None
    assert Job.objects.get(id=twin).status == "queued"


@pytest.mark.parametrize(
    ("error", "delay"),
    [(None, 0), (b"x", 0), ("x", -1), ("x", 31536001), ("x", float("nan")),
     ("x", float("inf")), ("x", True), ("x", "5")],
)
def test_deferral_arguments_are_validated(source, error, delay):
    enqueue("rolling.one")
    fence = claim(source).claim_fence
    with pytest.raises(ConfigValidationError):
        source.defer_owned(fence, error, delay=delay)


def test_a_nul_in_the_error_is_kept_visible(source):
    job_id = enqueue("rolling.one")
    assert source.defer_owned(claim(source).claim_fence, "a\x00b") is True
    assert Job.objects.get(id=job_id).last_error == "a\\x00b"


@pytest.mark.django_db(transaction=True)
def test_the_async_twin_does_the_same(source):
    asyncio.run(_async_twin(source))


async def _async_twin(source):
    from asgiref.sync import sync_to_async

    job_id = await sync_to_async(enqueue)("rolling.one")
    fence = (await source.aclaim_next_owned("worker-a", claim_token=nonce())).claim_fence
    with pytest.raises(ConfigValidationError):
        await source.adefer_owned(fence, "later", delay=-1)
    assert await source.adefer_owned(fence, "later", delay=0) is True
    assert await source.adefer_owned(fence, "later", delay=0) is False
    row = await sync_to_async(Job.objects.get)(id=job_id)
    assert (row.status, row.attempts) == ("queued", 0)
    await sync_to_async(connections.close_all)()  # the bridge thread's connection


@pytest.mark.postgresql_only
def test_soniq_defer_is_a_definer_function_nobody_else_may_call():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.prosecdef, p.proconfig, has_function_privilege('public', p.oid, 'EXECUTE')"
            "  FROM pg_proc AS p WHERE p.pronamespace = current_schema()::regnamespace"
            "   AND p.proname = 'soniq_defer'")
        assert cursor.fetchall() == [(True, ["search_path=pg_catalog, pg_temp"], False)]


@pytest.mark.postgresql_only
@pytest.mark.parametrize("delay", ["-1", "'NaN'", "31536001", "NULL"])
def test_soniq_defer_refuses_a_bad_delay_with_config(source, delay):
    from django.db import DatabaseError, transaction

    enqueue("rolling.one")
    f = claim(source).claim_fence
    with pytest.raises(DatabaseError) as caught, transaction.atomic(), connection.cursor() as c:
        c.execute(f"SELECT soniq_defer(%s, %s, %s, %s, %s, 'e', {delay})",
                  [f.job_id, f.worker_id, f.generation, f.claim_token, f.queue])
    assert (caught.value.__cause__.sqlstate, caught.value.__cause__.diag.message_hint) == (
        "22023", "CONFIG")
