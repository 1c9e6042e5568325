"""Owned claims under real concurrency: threads with their own connections."""

import threading
import time

import pytest
from django.db import connection, connections
from django.test import override_settings

from soniq_django import bulk_enqueue, enqueue
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.producer.request import JobRequest
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from tests.support.concurrency import run_threads
from tests.support.outages import lose_connection
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db(transaction=True)


def test_concurrent_workers_never_hold_the_same_live_claim():
    bulk_enqueue([JobRequest("a.job", {"n": n}) for n in range(60)])
    source = OwnedJobSource()

    def worker(index):
        taken = []
        while (claimed := source.claim_next_owned(f"w{index}", claim_token=nonce())) is not None:
            taken.append(claimed)
            assert source.complete_owned(claimed.claim_fence, index)
        return taken

    taken = [c for batch in run_threads(worker, 6) for c in batch]
    assert len(taken) == 60
    assert len({c.job_id for c in taken}) == 60
    assert Job.objects.filter(status="done").count() == 60


@override_settings(SONIQ={"LEASE_SECONDS": 1})
def test_a_stale_worker_is_refused_after_its_lease_lapses():
    job_id = enqueue("a.slow")
    source = OwnedJobSource()
    stale = source.claim_next_owned("worker-a", claim_token=nonce())
    time.sleep(1.2)  # worker-a stops heartbeating; its lease lapses
    fresh = source.claim_next_owned("worker-b", claim_token=nonce())
    assert fresh.job_id == job_id
    assert fresh.claim_fence.generation > stale.claim_fence.generation

    def finish(index):
        fence = (stale, fresh)[index % 2].claim_fence
        return source.complete_owned(fence, {"by": fence.worker_id})

    outcomes = run_threads(finish, 8)
    assert outcomes.count(True) == 1
    assert any(outcomes[1::2])  # the fresh fence applied, once
    assert not any(outcomes[0::2])  # the stale fence never did
    assert Job.objects.get(id=job_id).result == {"by": "worker-b"}


def _hold_write_lock_on(job_id, seconds, locked):
    """In another connection, lock the job row (or SQLite's database) for ``seconds``."""
    conn = connections.create_connection("default")
    try:
        conn.set_autocommit(False)
        with conn.cursor() as cursor:
            if conn.vendor == "postgresql":
                cursor.execute("SELECT 1 FROM soniq_jobs WHERE id = %s FOR UPDATE", [job_id])
            else:
                cursor.execute("UPDATE soniq_jobs SET status = status WHERE 0")
        locked.set()
        time.sleep(seconds)
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize("operation", ["heartbeat", "complete"])
@override_settings(SONIQ={"LEASE_SECONDS": 1})
def test_a_write_that_waits_on_the_lock_past_the_lease_is_refused(operation):
    enqueue("a.job")
    source = OwnedJobSource()
    claimed = source.claim_next_owned("worker-a", claim_token=nonce())
    locked = threading.Event()
    holder = threading.Thread(
        target=_hold_write_lock_on, args=(claimed.job_id, 1.5, locked)
    )
    holder.start()
    assert locked.wait(10)
    started = time.monotonic()
    if operation == "heartbeat":
        applied = source.heartbeat_owned(claimed.claim_fence)
    else:
        applied = source.complete_owned(claimed.claim_fence)
    waited = time.monotonic() - started
    holder.join()
    assert waited > 0.5  # it really waited for the lock
    assert applied is False  # time was taken after the lock: the lease had lapsed
    assert Job.objects.get(id=claimed.job_id).status == "processing"


def test_identical_concurrent_submissions_make_one_job():
    source = OwnedJobSource()
    ids = run_threads(
        lambda i: source.submit_owned(JobRequest("a.job", {"x": 1}), submission_id="same"), 5
    )
    assert len(set(ids)) == 1
    assert Job.objects.count() == 1


def test_one_nonce_racing_in_two_claims_conflicts_once():
    bulk_enqueue([JobRequest("a.job", {"n": n}) for n in range(4)])
    source = OwnedJobSource()
    token = nonce()

    def attempt(index):
        try:
            return source.claim_next_owned(f"w{index}", claim_token=token)
        except SoniqError as error:
            return error.code

    outcomes = run_threads(attempt, 4)
    claims = [o for o in outcomes if not isinstance(o, ErrorCode)]
    assert len(claims) == 1
    assert all(o is ErrorCode.QUEUE_CLAIM_CONFLICT for o in outcomes if o not in claims)
    assert Job.objects.filter(status="processing").count() == 1


def test_a_changed_claim_identity_rolls_the_whole_claim_back():
    job_id = enqueue("a.job")
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "CREATE FUNCTION pg_temp.shout() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN NEW.claim_owner := upper(NEW.claim_owner); RETURN NEW; END $$"
            )
            cursor.execute(
                "CREATE TRIGGER shout BEFORE UPDATE ON soniq_jobs FOR EACH ROW "
                "EXECUTE FUNCTION pg_temp.shout()"
            )
        else:
            cursor.execute(
                "CREATE TRIGGER shout AFTER UPDATE OF claim_owner ON soniq_jobs "
                "BEGIN UPDATE soniq_jobs SET claim_owner = upper(NEW.claim_owner) "
                "WHERE id = NEW.id AND claim_owner <> upper(NEW.claim_owner); END"
            )
    try:
        with pytest.raises(SoniqError) as caught:
            OwnedJobSource().claim_next_owned("worker-a", claim_token=nonce())
        assert caught.value.code is ErrorCode.QUEUE_CLAIM_CONFLICT
        assert caught.value.reason == "claim_identity_changed"
        row = Job.objects.get(id=job_id)
        assert (row.status, row.attempts, row.claim_generation, row.claim_token) == (
            "queued", 0, 0, None,
        )
    finally:
        with connection.cursor() as cursor:
            on_table = " ON soniq_jobs" if connection.vendor == "postgresql" else ""
            cursor.execute("DROP TRIGGER shout" + on_table)


@pytest.mark.postgresql_only
def test_a_lost_connection_raises_persistence_failed_never_false():
    enqueue("a.job")
    source = OwnedJobSource()
    claimed = source.claim_next_owned("worker-a", claim_token=nonce())
    lose_connection()
    with pytest.raises(SoniqError) as caught:
        source.complete_owned(claimed.claim_fence)
    assert caught.value.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
    assert claimed.claim_fence.claim_token not in str(caught.value)
    connection.close()
    assert source.complete_owned(claimed.claim_fence) is True


@pytest.mark.postgresql_only
def test_legacy_id_only_writes_skip_protected_and_owned_rows():
    """An older worker's UPDATE/DELETE by id leaves owned work alone."""
    source = OwnedJobSource()
    protected = source.submit_owned(JobRequest("a.owned", {}), submission_id="s1")
    legacy_owned = enqueue("a.legacy")
    plain = enqueue("a.plain", priority=1000)
    claimed = source.claim_next_owned("worker-a", claim_token=nonce(), queues=["default"])
    # The first claim took `protected` (oldest, same priority); claim the legacy row too.
    second = source.claim_next_owned("worker-a", claim_token=nonce(), queues=["default"])
    assert {claimed.job_id, second.job_id} == {protected, legacy_owned}
    with connection.cursor() as cursor:
        for job_id in (protected, legacy_owned, plain):
            cursor.execute(
                "UPDATE soniq_jobs SET status = 'done', result = '1' WHERE id = %s", [job_id]
            )
        cursor.execute("DELETE FROM soniq_jobs WHERE id = %s", [protected])
    statuses = dict(Job.objects.values_list("id", "status"))
    assert statuses[protected] == "processing" and statuses[legacy_owned] == "processing"
    assert statuses[plain] == "done"  # not protected: legacy writes still work there
    assert source.complete_owned(claimed.claim_fence) is True
    # A finished owned submission stays protected from legacy rewrites and deletes.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE soniq_jobs SET status = 'queued' WHERE id = %s", [protected])
        cursor.execute("DELETE FROM soniq_jobs WHERE id = %s", [protected])
    assert Job.objects.get(id=protected).status == "done"
