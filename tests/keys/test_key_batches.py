"""Batches of completions and claims across keys, in one transaction each, from racing threads.

A worker of concurrency above 1 completes several jobs and claims several in
one transaction (``complete_many_and_claim_owned``); each row's trigger locks
its key's row. Racing such batches over shared keys: every job done, no key
past its limit, and no round refused. Before claim protocol v13 two batches
could each hold a key the other waited for, until PostgreSQL ended one as a
deadlock (6 to 12 refused rounds a run); now a claim never waits for a key's
row and the completions lock theirs in key order (tests/keys/test_key_deadlocks.py
makes each crossing deterministic). A bulk enqueue writes its keyed jobs in
key order for the same reason.
"""

import threading
import time

import pytest
from django.db import connections

from soniq_django import bulk_enqueue
from soniq_django.errors import SoniqError, sqlstate
from soniq_django.keys.models import KeySlot
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from soniq_django.producer.request import JobRequest
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db(transaction=True)


def test_racing_batches_across_keys_finish_every_job_within_the_limits():
    keys, per_key, limit = 8, 12, 3
    bulk_enqueue([JobRequest("keys.batch", {"n": n}, concurrency_key=f"k{n % keys}",
                             key_concurrency=limit) for n in range(keys * per_key)])
    refused, errors, most = [], [], [0]
    lock = threading.Lock()

    def worker(index):
        source, held = OwnedJobSource(), []
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                tokens = [nonce() for _ in range(4)]
                try:
                    if held:
                        completed, claimed = source.complete_many_and_claim_owned(
                            [(c.claim_fence, None) for c in held], claim_tokens=tokens)
                        assert all(completed)
                    else:
                        claimed = source.claim_many_owned(f"w{index}", claim_tokens=tokens)
                except SoniqError as error:
                    with lock:
                        refused.append(sqlstate(error.__context__))
                    continue  # the round rolled back: the same completions again
                held = claimed
                running = max(KeySlot.objects.values_list("running", flat=True), default=0)
                with lock:
                    most[0] = max(most[0], running)
                if not held and not Job.objects.exclude(status="done").exists():
                    return
                time.sleep(0.002)
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not errors, errors[0]
    assert Job.objects.filter(status="done").count() == keys * per_key
    assert most[0] <= limit
    assert set(KeySlot.objects.values_list("running", "head")) == {(0, None)}
    assert refused == []  # before v13, on PostgreSQL: ["40P01", ...]


def test_racing_bulk_enqueues_of_the_same_keys_in_opposite_orders_all_go_through():
    keys = [f"k{n:02d}" for n in range(20)]
    errors = []

    def producer(index):
        order = keys if index == 0 else keys[::-1]
        try:
            for round_ in range(8):
                bulk_enqueue([JobRequest("keys.bulk", {"n": round_}, concurrency_key=key,
                                         key_concurrency=1) for key in order])
        except SoniqError as error:  # before the bulk wrote in key order: a deadlock
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert errors == []
    assert Job.objects.count() == 2 * 8 * len(keys)
