"""Item 5: racing claimers in real threads never run more of a key than its limit.

Each claimer is a thread with its own connection, claiming batches through
OwnedJobSource (soniq_claim_many on PostgreSQL, SqliteClaims on SQLite) and
completing each job after a short sleep. What runs is stamped from inside
the "handler" (between the claim's answer and the completion's call): per
key, never more intervals overlapping than its limit; and the rate run:
never more than N claims of a key in any window. Both databases.
"""

import random
import threading
import time

import pytest
from django.db import connections

from soniq_django import bulk_enqueue
from soniq_django.keys.models import KeyHold, KeyParked, KeySlot
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from soniq_django.producer.request import JobRequest
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 30  # LEASE_SECONDS' default


def most_overlapping(intervals):
    """The largest number of ``(start, end)`` intervals open at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda event: (event[0], event[1]))
    open_now = most = 0
    for _, step in events:
        open_now += step
        most = max(most, open_now)
    return most


def race(claimers, batch, work, until_empty=True, deadline=60.0):
    """Run ``claimers`` threads claiming ``batch`` at a time; returns the stamps per key
    as ``{key: [(start, end), ...]}`` and the claim times ``{key: [t, ...]}``."""
    stamps, starts, errors = {}, {}, []
    lock = threading.Lock()
    gate = threading.Barrier(claimers)
    stop_at = time.monotonic() + deadline

    def claimer(index):
        source = OwnedJobSource()
        worker = f"w-{index}"
        try:
            gate.wait()
            idle = 0
            while time.monotonic() < stop_at:
                got = source.claim_many_owned(worker, claim_tokens=[nonce() for _ in range(batch)])
                if not got:
                    if until_empty and not Job.objects.filter(status="queued").exists():
                        return
                    idle += 1
                    time.sleep(0.005)
                    continue
                keys = dict(Job.objects.filter(id__in=[c.job_id for c in got]).values_list(
                    "id", "concurrency_key"))
                for claimed in got:
                    began = time.monotonic()
                    with lock:  # the claim's own time: its lease counts from it
                        starts.setdefault(keys[claimed.job_id], []).append(
                            claimed.lease_expires_at.timestamp() - LEASE)
                    time.sleep(work * random.random())
                    ended = time.monotonic()
                    with lock:
                        stamps.setdefault(keys[claimed.job_id], []).append((began, ended))
                    assert source.complete_owned(claimed.claim_fence) is True
        except BaseException as error:  # reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(deadline + 30)
    assert not errors, errors[0]
    return stamps, starts


def test_racing_claimers_never_run_more_of_a_key_than_its_limit():
    limits = {"k0": 1, "k1": 1, "k2": 2, "k3": 3}
    requests = [JobRequest("keys.race", {"n": n}, concurrency_key=key, key_concurrency=limit)
                for n in range(15) for key, limit in limits.items()]
    requests += [JobRequest("keys.free", {"n": n}) for n in range(10)]
    random.shuffle(requests)
    bulk_enqueue(requests)
    stamps, _ = race(claimers=6, batch=3, work=0.06)
    assert Job.objects.filter(status="done").count() == len(requests)
    for key, limit in limits.items():
        assert len(stamps[key]) == 15
        assert most_overlapping(stamps[key]) <= limit, key
    assert max(most_overlapping(stamps[key]) for key in ("k2", "k3")) >= 2  # slots were used
    assert not KeyParked.objects.exists() and not KeyHold.objects.exists()
    assert set(KeySlot.objects.values_list("running", "head")) == {(0, None)}


def test_racing_claimers_never_start_more_than_the_keys_rate_in_any_window():
    rate, period = 4, 1.0
    bulk_enqueue([JobRequest("keys.rate", {"n": n}, concurrency_key=key, key_rate=f"{rate}/s")
                  for n in range(14) for key in ("r0", "r1")])
    _, starts = race(claimers=4, batch=2, work=0.0, deadline=5.0)
    for key, times in starts.items():
        times.sort()
        most = max(sum(1 for s in times if t - period < s <= t) for t in times)
        assert most <= rate, key
        assert len(times) >= 2 * rate  # and the rate was used
    # From the database: the starts logged for each key (the claims' own times).
    from soniq_django.keys.models import KeyStart
    for key in ("r0", "r1"):
        logged = sorted(KeyStart.objects.filter(key=key).values_list("started_at", flat=True))
        for i in range(len(logged) - rate):
            assert (logged[i + rate] - logged[i]).total_seconds() >= period
