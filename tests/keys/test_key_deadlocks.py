"""A claim never waits for a key's row, so rounds across keys cannot deadlock (PostgreSQL).

A worker above concurrency 1 completes and claims jobs of several keys in one
transaction. Each keyed row's trigger works under its key's row lock; before
claim protocol v13 a claim waited for it, so two rounds that had completed
jobs of keys the other then claimed waited for each other until PostgreSQL
ended one (SQLSTATE 40P01, after ``deadlock_timeout``). Here two raw
transactions make that cross deterministically, a producer's open
transaction holds a key while a claim comes for its offered job, and two
rounds complete jobs of the same keys named in opposite orders.
SQLite has one writer at a time: nothing to cross there (tests/keys/
test_key_batches.py races the same batches on both databases).
"""

import datetime as dt
import threading
import time
import uuid

import psycopg
import pytest

from soniq_django import bulk_enqueue
from soniq_django.keys.models import KeySlot
from soniq_django.owned import OwnedJobSource
from soniq_django.producer.request import JobRequest
from tests.support.owned import claim, nonce
from tests.support.sql import raw

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True)]

COMPLETE = ("SELECT soniq_complete_many(%s::text[], %s, %s::bigint[], %s::text[], %s::text[], "
            "%s::text[]::jsonb[])")
CLAIM = "SELECT job_id FROM soniq_claim_many(%s, %s::text[], %s::text[])"


def running_and_offered(queue, key="k", count=3, worker="w-setup"):
    """``count`` jobs of ``key`` at a limit of 2 in ``queue``: the first claimed (its fence
    returned), the second offered."""
    bulk_enqueue([JobRequest("keys.cross", {"n": n}, queue=queue, concurrency_key=key,
                             key_concurrency=2) for n in range(count)])
    return claim(OwnedJobSource(), worker=worker, queues=[queue]).claim_fence


def complete(conn, *fences):
    conn.execute(COMPLETE, ([f.job_id for f in fences], fences[0].worker_id,
                            [f.generation for f in fences], [f.claim_token for f in fences],
                            [f.queue for f in fences], ["null"] * len(fences)))


def claim_in(conn, queue, wanted=1):
    return [row[0] for row in conn.execute(
        CLAIM, ("w-round", [nonce() for _ in range(wanted)], [queue])).fetchall()]


def waiting_for_a_lock(conn, pid):
    return conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s",
                        (pid,)).fetchone()[0]


def test_two_rounds_that_claim_each_others_keys_do_not_deadlock():
    x = running_and_offered("qa", worker="w-setup")
    y = running_and_offered("qb", worker="w-setup")
    errors, claimed = {}, {}
    with raw(autocommit=False) as a, raw(autocommit=False) as b, raw() as watch:
        for conn in (a, b):
            conn.execute("SET lock_timeout = '20s'")  # a bound: the deadlock ends sooner
        complete(a, x)  # round A holds key (qa, k)
        complete(b, y)  # round B holds key (qb, k)

        def round_a():
            try:
                claimed["a"] = claim_in(a, "qb")  # (qb, k)'s offered job
            except psycopg.Error as error:
                errors["a"] = error.sqlstate

        thread = threading.Thread(target=round_a)
        thread.start()
        until = time.monotonic() + 5
        while thread.is_alive() and not waiting_for_a_lock(watch, a.info.backend_pid):
            assert time.monotonic() < until
            time.sleep(0.01)
        try:
            claimed["b"] = claim_in(b, "qa")  # (qa, k)'s offered job
        except psycopg.Error as error:
            errors["b"] = error.sqlstate
        thread.join(30)
        for conn in (a, b):
            conn.rollback() if conn.info.transaction_status == 3 else conn.commit()
    assert errors == {}  # before v13: one of them {"a" or "b": "40P01"}
    # Neither waited for the other's key: each left the offered job it could not take.
    assert claimed == {"a": [], "b": []}
    # Nothing was lost: the offered jobs are there for the next claims.
    source = OwnedJobSource()
    assert claim(source, worker="w-next", queues=["qa"]).queue == "qa"
    assert claim(source, worker="w-next", queues=["qb"]).queue == "qb"
    assert sorted(KeySlot.objects.values_list("queue", "running")) == [("qa", 1), ("qb", 1)]


def test_a_producers_open_transaction_does_not_hold_up_the_claim_of_its_keys_offered_job():
    bulk_enqueue([JobRequest("keys.offered", {}, queue="qp", concurrency_key="k",
                             key_concurrency=2)])
    with raw(autocommit=False) as producer, raw() as claimer:
        producer.execute("SELECT soniq_enqueue_keyed('k', 2, NULL, 'keys.more', '{}'::jsonb, "
                         "queue => 'qp')")  # holds (qp, k) until it commits
        claimer.execute("SET lock_timeout = '3s'")
        began = time.monotonic()
        assert claim_in(claimer, "qp", wanted=2) == []  # before v13: 55P03 after 3 s
        assert time.monotonic() - began < 1.5
        producer.commit()
        # Nothing lost: the offered job, then the next one offered (the limit is 2).
        assert len(claim_in(claimer, "qp") + claim_in(claimer, "qp")) == 2


def test_rounds_completing_the_same_keys_in_opposite_orders_do_not_deadlock():
    count = 12
    # Key i's two jobs: one whose id comes i-th in id order, one whose id comes i-th
    # from the end. A round locks its rows in id order, so round A meets the keys in
    # one order and round B in the other.
    ids = {i: (uuid.UUID(f"{i + 1:08x}-0000-4000-8000-000000000000"),
               uuid.UUID(f"{0xf0000000 - i:08x}-0000-4000-8000-000000000000"))
           for i in range(count)}
    bulk_enqueue([JobRequest("keys.cross", {}, queue="qo", concurrency_key=f"k{i:02d}",
                             key_concurrency=2, job_id=job_id)
                  for i in range(count) for job_id in ids[i]])
    source = OwnedJobSource()
    fences = {}
    for _ in range(2 * count):
        fence = claim(source, worker="w-setup", queues=["qo"]).claim_fence
        fences[uuid.UUID(fence.job_id)] = fence
    forward = [fences[ids[i][0]] for i in range(count)]
    backward = [fences[ids[i][1]] for i in range(count)]
    errors = []
    with raw(autocommit=False) as a, raw(autocommit=False) as b:
        for conn in (a, b):
            conn.execute("SET lock_timeout = '20s'")
        gate = threading.Barrier(2)

        def round_of(conn, batch):
            try:
                gate.wait()
                complete(conn, *batch)
                time.sleep(0.2)  # the keys held a while, as by a round's claim after it
                conn.commit()
            except psycopg.Error as error:
                errors.append(error.sqlstate)
                conn.rollback()

        threads = [threading.Thread(target=round_of, args=(conn, batch))
                   for conn, batch in ((a, forward), (b, backward))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert errors == []  # before v13: ["40P01"]
    assert set(KeySlot.objects.filter(queue="qo").values_list("running", flat=True)) == {0}


def test_a_claim_of_a_limited_queue_leaves_a_lapsed_hold_whose_key_is_held_elsewhere(settings):
    from django.db import connection
    from django.utils import timezone

    from soniq_django.models import QueueHold

    settings.SONIQ = {"RETRY_BASE_SECONDS": 0, "RETRY_MAX_SECONDS": 0}
    bulk_enqueue([JobRequest("keys.held", {}, queue="ql", concurrency_key="k", key_concurrency=1,
                             max_attempts=3)])
    source = OwnedJobSource()
    timed_out = claim(source, worker="w-setup", queues=["ql"]).claim_fence
    assert source._fail_and_hold(timed_out, "timed out after 1 s") is True  # keeps k's slot
    QueueHold.objects.update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    bulk_enqueue([JobRequest("keys.plain", {}, queue="ql")])
    with connection.cursor() as cursor:  # a limited queue: its claims count under its budget
        cursor.execute("INSERT INTO soniq_queue_settings (queue, concurrency) VALUES ('ql', 10)")
    with raw(autocommit=False) as producer, raw() as claimer:
        producer.execute("SELECT soniq_enqueue_keyed('k', 1, NULL, 'keys.more', '{}'::jsonb, "
                         "queue => 'ql')")  # holds (ql, k) until it commits
        claimer.execute("SET lock_timeout = '3s'")
        began = time.monotonic()
        [(job_name,)] = claimer.execute(
            "SELECT job_name FROM soniq_claim_many('w-round', ARRAY[%s], ARRAY['ql'])",
            (nonce(),)).fetchall()  # before v13: 55P03 after 3 s (the budget's deletion)
        assert job_name == "keys.plain" and time.monotonic() - began < 1.5
        assert QueueHold.objects.count() == 1  # left for later
        producer.commit()
    with connection.cursor() as cursor:
        cursor.execute("SELECT soniq_key_sweep()")
        assert cursor.fetchone()[0] == 1
    assert KeySlot.objects.get(queue="ql", key="k").running == 0


def test_the_housekeepings_sweep_waits_for_a_held_key_at_most_its_lock_wait(settings):
    from django.utils import timezone

    from soniq_django.errors import ErrorCode, SoniqError
    from soniq_django.keys.limits import sweep_lapsed_holds
    from soniq_django.models import QueueHold

    settings.SONIQ = {"RETRY_BASE_SECONDS": 0, "RETRY_MAX_SECONDS": 0}
    bulk_enqueue([JobRequest("keys.held", {}, queue="qs", concurrency_key="k", key_concurrency=1,
                             max_attempts=3)])
    source = OwnedJobSource()
    timed_out = claim(source, worker="w-setup", queues=["qs"]).claim_fence
    assert source._fail_and_hold(timed_out, "timed out after 1 s") is True
    QueueHold.objects.update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    with raw(autocommit=False) as producer:
        producer.execute("SELECT soniq_enqueue_keyed('k', 1, NULL, 'keys.more', '{}'::jsonb, "
                         "queue => 'qs')")  # holds (qs, k) until it commits
        began = time.monotonic()
        with pytest.raises(SoniqError) as refused:
            sweep_lapsed_holds("default", lock_wait=0.2)
        assert refused.value.code == ErrorCode.QUEUE_PERSISTENCE_FAILED
        assert time.monotonic() - began < 2
        assert QueueHold.objects.count() == 1  # nothing deleted
        producer.commit()
    assert sweep_lapsed_holds("default", lock_wait=0.2) == 1
    assert KeySlot.objects.get(queue="qs", key="k").running == 0
