"""Batched claims (claim_many_owned / soniq_claim_many): one call, one fence per job."""

import asyncio
import dataclasses
import datetime as dt
import uuid

import pytest
from django.db import connection, connections
from django.utils import timezone

from soniq_django import bulk_enqueue, enqueue
from soniq_django.errors import ConfigValidationError, ErrorCode, SoniqError
from soniq_django.producer.request import JobRequest
from soniq_django.models import DeadLetterJob, Job, Worker
from soniq_django.owned import OwnedJobSource, OwnedJobState
from soniq_django.owned.types import MAX_CLAIM_BATCH
from tests.support.concurrency import run_threads
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db


@pytest.fixture
def source():
    return OwnedJobSource()


def tokens(count):
    return [nonce() for _ in range(count)]


def test_each_job_gets_its_own_nonce_and_generation_in_claim_order(source):
    low = enqueue("a.low", priority=200)
    first = enqueue("a.first", priority=10)
    second = enqueue("a.second", priority=10)
    rewrite(second, claim_generation=41)  # generations are per row, not per batch
    sent = tokens(5)
    claimed = source.claim_many_owned("worker-1", claim_tokens=sent, pid=77)
    assert [c.job_id for c in claimed] == [first, second, low]
    assert [c.claim_fence.claim_token for c in claimed] == sent[:3]
    assert [c.claim_fence.generation for c in claimed] == [1, 42, 1]
    for c in claimed:
        row = Job.objects.get(id=c.job_id)
        assert (row.status, row.claim_owner, row.claim_token, row.claim_generation, row.pid,
                row.attempts) == ("processing", "worker-1", c.claim_fence.claim_token,
                                  c.claim_fence.generation, 77, 1)
        assert c.lease_expires_at > timezone.now()
        assert source.get_owned_state(c.claim_fence) == OwnedJobState(False, 77)
    # The two nonces left over were never stored: they may be sent again.
    assert not Job.objects.filter(claim_token__in=sent[3:]).exists()
    later = enqueue("a.later")
    again = source.claim_many_owned("worker-1", claim_tokens=sent[3:])
    assert [c.job_id for c in again] == [later]


def test_every_fence_works_alone(source):
    ids = bulk_enqueue([JobRequest("a.job", {"n": n}) for n in range(4)])
    claimed = source.claim_many_owned("w", claim_tokens=tokens(4))
    assert sorted(c.job_id for c in claimed) == sorted(ids)
    done, failed, beat, cancelled = claimed
    assert source.complete_owned(done.claim_fence, "ok")
    assert source.complete_owned(done.claim_fence, "again") is False
    assert source.fail_owned(failed.claim_fence, "boom", retry=False)
    assert source.heartbeat_owned(beat.claim_fence)
    assert source.request_cancel(cancelled.job_id)
    assert source.acknowledge_cancel_owned(cancelled.claim_fence)
    # A fence from one job never opens another of the same batch.
    crossed = done.claim_fence.__class__(
        queue=beat.queue, job_id=str(beat.job_id), worker_id="w",
        generation=beat.claim_fence.generation, claim_token=done.claim_fence.claim_token)
    assert source.complete_owned(crossed) is False
    assert Job.objects.get(id=beat.job_id).status == "processing"
    assert DeadLetterJob.objects.filter(id=failed.job_id).exists()


def test_queues_and_due_times_are_respected(source):
    mine = enqueue("a.mine", queue="mine")
    enqueue("a.other", queue="other")
    enqueue("a.later", queue="mine", run_at=timezone.now() + dt.timedelta(hours=1))
    claimed = source.claim_many_owned("w", claim_tokens=tokens(3), queues=["mine"])
    assert [c.job_id for c in claimed] == [mine]


def test_nothing_eligible_is_an_empty_list(source):
    assert source.claim_many_owned("w", claim_tokens=tokens(3)) == []


def test_a_used_nonce_fails_the_whole_call(source):
    for name in ("a.one", "a.two", "a.three"):
        enqueue(name)
    used = source.claim_next_owned("w", claim_token=nonce()).claim_fence.claim_token
    with pytest.raises(SoniqError) as caught:
        source.claim_many_owned("w", claim_tokens=[nonce(), used])
    assert caught.value.code is ErrorCode.QUEUE_CLAIM_CONFLICT
    assert caught.value.reason == "nonce_reused"
    assert used not in str(caught.value)
    assert Job.objects.filter(status="queued").count() == 2  # nothing claimed


def test_a_nonce_repeated_within_the_call_fails_it(source):
    enqueue("a.one")
    enqueue("a.two")
    token = nonce()
    with pytest.raises(SoniqError) as caught:
        source.claim_many_owned("w", claim_tokens=[token, token])
    assert (caught.value.code, caught.value.reason) == (
        ErrorCode.QUEUE_CLAIM_CONFLICT, "nonce_reused")
    assert Job.objects.filter(status="queued").count() == 2


@pytest.mark.parametrize(
    "claim_tokens",
    [[], "abc", None, [""], ["t" * 256], ["ok", None], ["ok", 5], ("t",) * 0, b"ab",
     [f"t{i}" for i in range(MAX_CLAIM_BATCH + 1)]],
)
def test_token_lists_are_validated(source, claim_tokens):
    enqueue("a.one")
    with pytest.raises(ConfigValidationError) as caught:
        source.claim_many_owned("w", claim_tokens=claim_tokens)
    assert caught.value.code is ErrorCode.CONFIG
    assert Job.objects.get().status == "queued"


@pytest.mark.parametrize("worker", ["", "w" * 256, None, 7])
def test_the_worker_id_is_validated(source, worker):
    with pytest.raises(ConfigValidationError):
        source.claim_many_owned(worker, claim_tokens=tokens(1))


def test_a_batch_reaps_lapsed_claims_first(source):
    lapsed = enqueue("a.lapsed")
    old = source.claim_next_owned("w-old", claim_token=nonce())
    rewrite(lapsed, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    claimed = source.claim_many_owned("w-new", claim_tokens=tokens(2))
    assert [c.job_id for c in claimed] == [lapsed]
    assert claimed[0].claim_fence.generation == old.claim_fence.generation + 1
    assert claimed[0].attempts == 2
    assert source.complete_owned(old.claim_fence) is False


def test_a_registered_worker_fills_worker_id_on_every_row(source):
    bulk_enqueue([JobRequest("a.job") for _ in range(3)])
    worker = uuid.uuid4()
    Worker.objects.create(id=worker, hostname="h", pid=1)
    source.claim_many_owned(str(worker), claim_tokens=tokens(3))
    assert set(Job.objects.values_list("worker_id", flat=True)) == {worker}


def test_an_exhausted_generation_fails_the_whole_call(source):
    first = enqueue("a.one", priority=1)
    second = enqueue("a.two", priority=2)
    rewrite(second, claim_generation=2**63 - 1)
    with pytest.raises(SoniqError) as caught:
        source.claim_many_owned("w", claim_tokens=tokens(2))
    assert caught.value.reason == "generation_exhausted"
    assert Job.objects.get(id=first).status == "queued"


@pytest.mark.django_db(transaction=True)
def test_concurrent_batches_never_share_a_job():
    bulk_enqueue([JobRequest("a.job", {"n": n}) for n in range(120)])
    source = OwnedJobSource()

    def worker(index):
        taken = []
        while batch := source.claim_many_owned(f"w{index}", claim_tokens=tokens(7)):
            for claimed in batch:
                assert source.complete_owned(claimed.claim_fence, index)
            taken.extend(batch)
        connections.close_all()
        return taken

    taken = [c for batch in run_threads(worker, 5) for c in batch]
    assert len(taken) == 120
    assert len({c.job_id for c in taken}) == 120
    assert Job.objects.filter(status="done").count() == 120


@pytest.mark.django_db(transaction=True)
def test_the_async_twin_does_the_same(source):
    asyncio.run(_async_twin(source))


async def _async_twin(source):
    from asgiref.sync import sync_to_async

    job_id = await sync_to_async(enqueue)("a.async")
    sent = tokens(2)
    claimed = await source.aclaim_many_owned("worker-a", claim_tokens=sent)
    assert [c.job_id for c in claimed] == [job_id]
    assert await source.arecover_owned_claim("worker-a", claim_token=sent[0]) == claimed[0]
    with pytest.raises(ConfigValidationError):
        await source.aclaim_many_owned("worker-a", claim_tokens=[])
    await sync_to_async(connections.close_all)()


@pytest.mark.postgresql_only
def test_the_sql_function_refuses_bad_arrays_with_config():
    from django.db import DatabaseError, transaction

    cases = [
        ("SELECT * FROM soniq_claim_many('w', ARRAY[]::text[])", "22023"),
        ("SELECT * FROM soniq_claim_many('w', NULL)", "22023"),
        ("SELECT * FROM soniq_claim_many('w', ARRAY[['a','b'],['c','d']])", "22023"),
        ("SELECT * FROM soniq_claim_many('w', ARRAY['a', NULL])", "22023"),
        ("SELECT * FROM soniq_claim_many('w', ARRAY['a', ''])", "22023"),
        ("SELECT * FROM soniq_claim_many('', ARRAY['a'])", "22023"),
        ("SELECT * FROM soniq_claim_many('w', ARRAY['a'], NULL, 0)", "22023"),
        ("SELECT * FROM soniq_claim_many('w', ARRAY['a'], NULL, 30, 300, 0)", "22023"),
        ("SELECT * FROM soniq_claim_many('w', ARRAY['a', 'a'])", "P0001"),
        ("SELECT * FROM soniq_claim_many('w', "
         "(SELECT array_agg(i::text) FROM generate_series(1, 1001) AS i))", "22023"),
    ]
    for sql, sqlstate in cases:
        with pytest.raises(DatabaseError) as caught, transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute(sql)
        assert caught.value.__cause__.sqlstate == sqlstate, sql
        expected_hint = "CONFIG" if sqlstate == "22023" else "QUEUE_CLAIM_CONFLICT"
        assert caught.value.__cause__.diag.message_hint == expected_hint, sql


# Complete and claim in one transaction --------------------------------------


def test_complete_and_claim_finishes_one_job_and_fences_the_next(source):
    first = enqueue("a.first", priority=1)
    second = enqueue("a.second", priority=2)
    running = source.claim_next_owned("w", claim_token=nonce())
    assert running.job_id == first
    sent = nonce()
    completed, claimed = source.complete_and_claim_owned(
        running.claim_fence, {"ok": 1}, claim_tokens=[sent, nonce()], pid=9)
    assert completed is True
    assert [(c.job_id, c.claim_fence.claim_token, c.claim_fence.worker_id) for c in claimed] == [
        (second, sent, "w")]
    assert (Job.objects.get(id=first).status, Job.objects.get(id=first).result) == (
        "done", {"ok": 1})
    assert source.get_owned_state(claimed[0].claim_fence) == OwnedJobState(False, 9)
    # The completion was applied once: the same fence completes nothing again.
    completed, claimed = source.complete_and_claim_owned(
        running.claim_fence, "again", claim_tokens=[nonce()])
    assert (completed, claimed) == (False, [])
    assert Job.objects.get(id=first).result == {"ok": 1}


def test_a_refused_completion_still_claims(source):
    enqueue("a.one", priority=1)
    nxt = enqueue("a.two", priority=2)
    running = source.claim_next_owned("w", claim_token=nonce())
    assert source.request_cancel(running.job_id)  # a cancel request refuses completion
    completed, claimed = source.complete_and_claim_owned(
        running.claim_fence, None, claim_tokens=[nonce()])
    assert completed is False and [c.job_id for c in claimed] == [nxt]
    assert Job.objects.get(id=running.job_id).status == "processing"


def test_complete_and_claim_writes_both_or_neither(source):
    job_id = enqueue("a.one")
    enqueue("a.two")
    running = source.claim_next_owned("w", claim_token=nonce())
    with pytest.raises(SoniqError) as caught:  # the claim half fails ...
        source.complete_and_claim_owned(
            running.claim_fence, "x", claim_tokens=[running.claim_fence.claim_token])
    assert caught.value.reason == "nonce_reused"
    row = Job.objects.get(id=job_id)  # ... so the completion was not written either
    assert (row.status, row.result) == ("processing", None)
    assert Job.objects.filter(status="queued").count() == 1
    assert source.complete_owned(running.claim_fence, "y") is True


def test_complete_and_claim_validates_before_writing(source):
    enqueue("a.one")
    running = source.claim_next_owned("w", claim_token=nonce())
    for kwargs in ({"claim_tokens": []}, {"claim_tokens": [""]}, {"claim_tokens": "t"},
                   {"claim_tokens": [nonce()], "queues": []}, {"claim_tokens": [nonce()], "pid": 0}):
        with pytest.raises(ConfigValidationError):
            source.complete_and_claim_owned(running.claim_fence, None, **kwargs)
    with pytest.raises(ConfigValidationError):
        source.complete_and_claim_owned(running.claim_fence, float("nan"),
                                        claim_tokens=[nonce()])
    assert Job.objects.get(id=running.job_id).status == "processing"


@pytest.mark.django_db(transaction=True)
def test_the_async_complete_and_claim_twin(source):
    async def body():
        from asgiref.sync import sync_to_async

        await sync_to_async(enqueue)("a.one", priority=1)
        nxt = await sync_to_async(enqueue)("a.two", priority=2)
        running = await source.aclaim_next_owned("w", claim_token=nonce())
        completed, claimed = await source.acomplete_and_claim_owned(
            running.claim_fence, 5, claim_tokens=[nonce()])
        assert completed is True and [c.job_id for c in claimed] == [nxt]
        await sync_to_async(connections.close_all)()

    asyncio.run(body())


# How version 2 is installed (PostgreSQL) -------------------------------------


def _pg(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


@pytest.mark.postgresql_only
def test_version_2_functions_are_pinned_definers_no_one_else_may_call():
    rows = _pg(
        "SELECT p.proname, p.prosecdef, p.proconfig, has_function_privilege('public', p.oid, "
        "'EXECUTE') FROM pg_proc AS p WHERE p.pronamespace = current_schema()::regnamespace "
        "AND p.proname IN ('soniq_claim_many', 'soniq_complete', 'soniq_complete_many') "
        "ORDER BY 1")
    # Claim protocol v11: claims plan without sorts where an index gives the claim order.
    assert rows == [(name, True, ["search_path=pg_catalog, pg_temp"]
                     + (["enable_sort=off", "jit=off"] if name == "soniq_claim_many" else []), False)
                    for name in ("soniq_claim_many", "soniq_complete", "soniq_complete_many")]


# Several completions in one transaction ----------------------------------------


def test_complete_many_answers_each_fence_in_order(source):
    bulk_enqueue([JobRequest("a.job", {"n": n}) for n in range(4)])
    first, second, third, fourth = source.claim_many_owned("w", claim_tokens=tokens(4))
    assert source.request_cancel(third.job_id)  # a cancel request refuses its completion
    stale = dataclasses.replace(fourth.claim_fence, generation=fourth.claim_fence.generation + 1)
    answers = source.complete_many_owned([
        (second.claim_fence, {"n": 2}), (first.claim_fence, [1]), (third.claim_fence, None),
        (stale, "stale"),
    ])
    assert answers == [True, True, False, False]
    rows = {row.id: row for row in Job.objects.all()}
    assert (rows[first.job_id].status, rows[first.job_id].result) == ("done", [1])
    assert (rows[second.job_id].status, rows[second.job_id].result) == ("done", {"n": 2})
    assert rows[third.job_id].status == rows[fourth.job_id].status == "processing"
    # Applied once: sending the same completions again changes nothing.
    assert source.complete_many_owned([(first.claim_fence, "again")]) == [False]
    assert Job.objects.get(id=first.job_id).result == [1]


def test_complete_many_and_claim_settles_and_refills_together(source):
    bulk_enqueue([JobRequest("a.job", {"n": n}) for n in range(5)])
    running = source.claim_many_owned("w", claim_tokens=tokens(2))
    sent = tokens(2)
    answers, claimed = source.complete_many_and_claim_owned(
        [(job.claim_fence, "ok") for job in running], claim_tokens=sent, pid=3)
    assert answers == [True, True]
    assert [c.claim_fence.claim_token for c in claimed] == sent
    assert Job.objects.filter(status="done").count() == 2
    assert Job.objects.filter(status="processing", pid=3).count() == 2
    # Both or neither: a claim that fails takes the completions back with it.
    with pytest.raises(SoniqError) as caught:
        source.complete_many_and_claim_owned(
            [(job.claim_fence, "x") for job in claimed], claim_tokens=[sent[0]])
    assert caught.value.reason == "nonce_reused"
    assert Job.objects.filter(status="processing", pid=3).count() == 2


@pytest.mark.parametrize("completions", [
    [], "x", None, [("not a fence", 1)], [(None, 1)], [1], [()],
])
def test_complete_many_validates_its_pairs(source, completions):
    with pytest.raises(ConfigValidationError):
        source.complete_many_owned(completions)


def test_complete_many_takes_fences_of_one_worker_and_finite_json(source):
    bulk_enqueue([JobRequest("a.job"), JobRequest("a.job")])
    mine = source.claim_next_owned("w-1", claim_token=nonce())
    theirs = source.claim_next_owned("w-2", claim_token=nonce())
    with pytest.raises(ConfigValidationError):
        source.complete_many_owned([(mine.claim_fence, 1), (theirs.claim_fence, 2)])
    with pytest.raises(ConfigValidationError):
        source.complete_many_owned([(mine.claim_fence, float("inf"))])
    assert Job.objects.filter(status="processing").count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_async_complete_many_twins(source):
    async def body():
        from asgiref.sync import sync_to_async

        await sync_to_async(bulk_enqueue)([JobRequest("a.job") for _ in range(3)])
        running = await source.aclaim_many_owned("w", claim_tokens=tokens(2))
        assert await source.acomplete_many_owned([(running[0].claim_fence, 1)]) == [True]
        answers, claimed = await source.acomplete_many_and_claim_owned(
            [(running[1].claim_fence, 2)], claim_tokens=tokens(1))
        assert answers == [True] and len(claimed) == 1
        await sync_to_async(connections.close_all)()

    asyncio.run(body())


@pytest.mark.postgresql_only
def test_soniq_complete_many_refuses_bad_arrays_with_config():
    from django.db import DatabaseError, transaction

    job = "'00000000-0000-0000-0000-000000000000'"
    cases = [
        "ARRAY[]::text[], 'w', ARRAY[]::bigint[], ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::jsonb[]",
        f"ARRAY[{job}], 'w', ARRAY[1, 2]::bigint[], ARRAY['t'], ARRAY['q'], ARRAY[NULL]::jsonb[]",
        f"ARRAY[{job}], 'w', ARRAY[1]::bigint[], ARRAY['t'], ARRAY['q'], ARRAY[]::jsonb[]",
        f"ARRAY[{job}], 'w', ARRAY[0]::bigint[], ARRAY['t'], ARRAY['q'], ARRAY[NULL]::jsonb[]",
        f"ARRAY[{job}], 'w', ARRAY[1]::bigint[], ARRAY['']::text[], ARRAY['q'], ARRAY[NULL]::jsonb[]",
        f"ARRAY[{job}], '', ARRAY[1]::bigint[], ARRAY['t'], ARRAY['q'], ARRAY[NULL]::jsonb[]",
        f"ARRAY[{job}], 'w', ARRAY[1]::bigint[], ARRAY['t'], ARRAY[NULL]::text[], ARRAY[NULL]::jsonb[]",
        f"ARRAY[{job}], 'w', NULL, ARRAY['t'], ARRAY['q'], ARRAY[NULL]::jsonb[]",
        f"'[0:0]={{{job[1:-1]}}}'::text[], 'w', ARRAY[1]::bigint[], ARRAY['t'], ARRAY['q'], "
        "ARRAY[NULL]::jsonb[]",
    ]
    for arguments in cases:
        with pytest.raises(DatabaseError) as caught, transaction.atomic(), \
                connection.cursor() as cursor:
            cursor.execute(f"SELECT soniq_complete_many({arguments})")
        assert caught.value.__cause__.sqlstate == "22023", arguments
        assert caught.value.__cause__.diag.message_hint == "CONFIG", arguments
    # A well-formed call about a job that does not exist is simply false.
    assert _pg(f"SELECT soniq_complete_many(ARRAY[{job}], 'w', ARRAY[1]::bigint[], "
               "ARRAY['t'], ARRAY['q'], ARRAY[NULL]::jsonb[])") == [([False],)]
