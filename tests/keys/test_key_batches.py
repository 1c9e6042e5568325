"""Batches of completions and claims across keys, in one transaction each, from racing threads.

A worker of concurrency above 1 completes several jobs and claims several in
one transaction (``complete_many_and_claim_owned``); each row's trigger locks
its key's row. This measures what racing such batches over shared keys do:
every job done, no key past its limit, and how many rounds the database
refused (a deadlock between two batches locking the same keys in other orders
is ended by PostgreSQL: the round is refused and retried).
"""

import threading
import time

import pytest
from django.db import connections

from soniq_django import bulk_enqueue
from soniq_django.errors import SoniqError
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
                except SoniqError:
                    with lock:
                        refused.append(index)
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
    print(f"rounds refused (deadlocks ended by the database): {len(refused)}")
