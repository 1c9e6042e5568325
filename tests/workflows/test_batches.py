"""batch() and chain(): the callback exactly once after every member finished; chains in order.

Both databases; the race of the last two completions with real threads.
"""

import threading
import uuid

import pytest
from django.db import connection, connections, transaction

from soniq_django import JobRequest, batch, batch_on_commit, chain, chain_on_commit, get_job, job
from soniq_django.errors import ConfigValidationError, ErrorCode
from soniq_django.models import Batch, BatchMember, Job, JobWait
from soniq_django.owned import OwnedJobSource
from soniq_django.testing import run_jobs
from soniq_django.worker import current_job
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db(transaction=True)

SEEN: list = []


@job(name="wfb.member")
def member(n: int = 0, fail: bool = False) -> int:
    if fail:
        raise RuntimeError("member failed")
    return n * 10


@job(name="wfb.callback", retries=0)
def callback() -> int:
    infos = current_job().batch()
    SEEN.append([(info.status, info.result) for info in infos])
    return len(infos)


def claim_all(source: OwnedJobSource) -> dict:
    claimed = {}
    while True:
        got = source.claim_next_owned("wfb-worker", claim_token=nonce())
        if got is None:
            return claimed
        claimed[uuid.UUID(str(got.job_id))] = got


def test_the_callback_runs_once_after_every_member_and_reads_their_outcomes():
    SEEN.clear()
    info = batch([JobRequest("wfb.member", {"n": n}, max_attempts=1) for n in range(3)]
                 + [JobRequest("wfb.member", {"fail": True}, max_attempts=1)],
                 on_complete=JobRequest("wfb.callback"))
    assert len(info.job_ids) == 4 and info.callback_id is not None
    assert Batch.objects.get(id=info.id).callback_id == info.callback_id
    assert JobWait.objects.get(job_id=info.callback_id).pending == 4
    run_jobs(raise_exceptions=False)
    assert SEEN == [[("done", 0), ("done", 10), ("done", 20), ("dead_letter", None)]]
    assert get_job(info.callback_id).status == "done"
    assert get_job(info.callback_id).result == 4


def test_the_callback_waits_while_a_member_is_retried():
    source = OwnedJobSource()
    info = batch([JobRequest("wfb.member", max_attempts=3)], on_complete=JobRequest("wfb.callback"))
    claimed = claim_all(source)
    assert set(claimed) == set(info.job_ids)
    assert source.fail_owned(claimed[info.job_ids[0]].claim_fence, "again", retry=True) is True
    assert JobWait.objects.get(job_id=info.callback_id).pending == 1
    assert claim_all(source) == {}  # the retry waits for its backoff; the callback for it


def test_a_cancelled_member_counts_as_finished():
    source = OwnedJobSource()
    info = batch([JobRequest("wfb.member"), JobRequest("wfb.member")],
                 on_complete=JobRequest("wfb.callback"))
    assert source.request_cancel(info.job_ids[0]) is True
    assert JobWait.objects.get(job_id=info.callback_id).pending == 1
    claimed = claim_all(source)
    assert set(claimed) == {info.job_ids[1]}
    assert source.complete_owned(claimed[info.job_ids[1]].claim_fence) is True
    assert set(claim_all(source)) == {info.callback_id}


def test_an_empty_batch_releases_its_callback_at_once():
    info = batch([], on_complete=JobRequest("wfb.callback"))
    assert info.job_ids == ()
    assert Job.objects.get(id=info.callback_id).scheduled_at is None


def test_a_batch_inside_a_transaction_that_rolls_back_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        batch([JobRequest("wfb.member")], on_complete=JobRequest("wfb.callback"))
        raise RuntimeError("rolled back")
    assert not Job.objects.exists() and not Batch.objects.exists()


def test_on_complete_takes_no_depends_on_of_its_own():
    with pytest.raises(ConfigValidationError) as raised:
        batch([JobRequest("wfb.member")],
              on_complete=JobRequest("wfb.callback", depends_on=[uuid.uuid4()]))
    assert raised.value.code == ErrorCode.INVALID_OPTION
    assert not Job.objects.exists()


def test_batch_on_commit_writes_after_the_commit_with_the_ids_it_returned():
    with transaction.atomic():
        info = batch_on_commit([JobRequest("wfb.member"), JobRequest("wfb.member")],
                               on_complete=JobRequest("wfb.callback"))
        assert not Job.objects.exists()
    assert set(Job.objects.values_list("id", flat=True)) == {*info.job_ids, info.callback_id}
    assert list(BatchMember.objects.filter(batch_id=info.id).order_by("position")
                .values_list("job_id", flat=True)) == list(info.job_ids)


def test_a_chain_runs_in_order_and_a_failure_cancels_the_rest():
    source = OwnedJobSource()
    ids = chain(JobRequest("wfb.member", {"n": 1}), JobRequest("wfb.member", {"n": 2}),
                JobRequest("wfb.member", {"n": 3}))
    claimed = claim_all(source)
    assert set(claimed) == {ids[0]}
    assert source.complete_owned(claimed[ids[0]].claim_fence) is True
    claimed = claim_all(source)
    assert set(claimed) == {ids[1]}
    assert source.fail_owned(claimed[ids[1]].claim_fence, "no", retry=False) is True
    third = get_job(ids[2])
    assert third.status == "cancelled" and third.last_error == f"dependency_failed:{ids[1]}"


def test_chain_on_commit():
    with transaction.atomic():
        ids = chain_on_commit(JobRequest("wfb.member"), JobRequest("wfb.member"))
        assert not Job.objects.exists()
    assert Job.objects.get(id=ids[1]).status == "queued"
    assert JobWait.objects.get(job_id=ids[1]).pending == 1


@pytest.mark.parametrize("round_", range(5))
def test_the_last_two_completions_racing_fire_the_callback_exactly_once(round_):
    """Two threads, two connections, each completing one of the last two members at once."""
    source = OwnedJobSource()
    info = batch([JobRequest("wfb.member"), JobRequest("wfb.member")],
                 on_complete=JobRequest("wfb.callback"))
    claimed = claim_all(source)
    assert set(claimed) == set(info.job_ids)
    barrier = threading.Barrier(2)
    answers, errors = [], []

    def finish(job_id):
        try:
            barrier.wait(10)
            answers.append(OwnedJobSource().complete_owned(claimed[job_id].claim_fence))
        except Exception as error:  # pragma: no cover - reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=finish, args=(job_id,)) for job_id in info.job_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == [] and answers == [True, True]
    assert not JobWait.objects.filter(job_id=info.callback_id).exists()
    assert Job.objects.get(id=info.callback_id).scheduled_at is None
    assert set(claim_all(source)) == {info.callback_id}


RACY_READ = """                SELECT w.pending - r.n, w.run_at INTO v_pending, v_run_at
                  FROM {schema}.soniq_job_waits AS w WHERE w.job_id = r.job_id;
                PERFORM pg_catalog.pg_sleep(0.3);
                UPDATE {schema}.soniq_job_waits AS w SET pending = v_pending
                 WHERE w.job_id = r.job_id;"""
LOCKED_DECREMENT = """                UPDATE {schema}.soniq_job_waits AS w SET pending = w.pending - r.n
                 WHERE w.job_id = r.job_id
                RETURNING w.pending, w.run_at INTO v_pending, v_run_at;"""


def _install(definition: str) -> None:
    from soniq_django.sql import fill_schema

    with connection.cursor() as cursor:
        cursor.execute("SELECT quote_ident(current_schema())")
        (schema,) = cursor.fetchone()
        cursor.execute(fill_schema(definition, schema))


@pytest.mark.postgresql_only
def test_the_race_test_finds_a_count_read_without_the_row_lock():
    """Re-introduce the chord race -- each completion reads the count, then writes it less
    one, without the row lock -- and the threads of the race test miss the callback."""
    from soniq_django.sql import released_function

    # The work list in force: v2 since 0032 (key_park_v1.sql), v1's count decrement unchanged.
    released = released_function("key_park_v1.sql", "soniq_settle_dependents_v2")
    assert LOCKED_DECREMENT in released
    _install(released.replace(LOCKED_DECREMENT, RACY_READ))
    try:
        source = OwnedJobSource()
        info = batch([JobRequest("wfb.member"), JobRequest("wfb.member")],
                     on_complete=JobRequest("wfb.callback"))
        claimed = claim_all(source)
        barrier = threading.Barrier(2)

        def finish(job_id):
            try:
                barrier.wait(10)
                OwnedJobSource().complete_owned(claimed[job_id].claim_fence)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=finish, args=(job_id,)) for job_id in info.job_ids]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        # Both read 2 and wrote 1: the callback is never released ("fire never").
        assert JobWait.objects.get(job_id=info.callback_id).pending == 1
        assert claim_all(source) == {}
    finally:
        _install(released)
