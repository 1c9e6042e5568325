"""Limits per key with real worker processes (``manage.py soniq_worker``), on both databases.

The jobs are the test app's ``tests.worker.sleep`` and ``tests.worker.ok``,
enqueued with a key: the workers know nothing of keys, the database does the
counting. The handlers' own start and end times come from the run log.
"""

import time
from collections import defaultdict

import pytest

from soniq_django import bulk_enqueue
from soniq_django.models import Job
from soniq_django.producer.request import JobRequest
from tests.support.workers import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

QUIET = {"HEARTBEAT_SECONDS": 1, "POLL_INTERVAL": 0.2}


def most_at_once(intervals):
    edges = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                   key=lambda edge: (edge[0], edge[1]))
    running = most = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def test_three_workers_never_run_two_jobs_of_a_key_at_once(children, run_log):
    keyed = bulk_enqueue([JobRequest("tests.worker.sleep", {"seconds": 0.15},
                                     concurrency_key=f"tenant-{n % 3}", key_concurrency=1)
                          for n in range(18)])
    bulk_enqueue([JobRequest("tests.worker.sleep", {"seconds": 0.15}) for _ in range(6)])
    for _ in range(3):
        children.start("soniq_worker", "--concurrency", "3", **QUIET)
    wait_until(lambda: Job.objects.filter(status="done").count() == 24, 90, "every job done")
    keys = dict(Job.objects.filter(id__in=keyed).values_list("id", "concurrency_key"))
    starts = {e.job_id: e.at for e in run_log.events("start")}
    ends = {e.job_id: e.at for e in run_log.events("end")}
    per_key = defaultdict(list)
    for job_id, key in keys.items():
        per_key[key].append((starts[str(job_id)], ends[str(job_id)]))
    assert sorted(per_key) == ["tenant-0", "tenant-1", "tenant-2"]
    for key, intervals in per_key.items():
        assert len(intervals) == 6 and most_at_once(intervals) == 1, key
    # The keys ran beside each other: the limit is per key, not per queue.
    assert most_at_once([i for intervals in per_key.values() for i in intervals]) >= 2


def test_a_keys_rate_holds_across_workers_and_is_reached(children, run_log):
    rate, jobs = 5, 15
    bulk_enqueue([JobRequest("tests.worker.ok", {"n": n}, concurrency_key="token-1",
                             key_rate=f"{rate}/s") for n in range(jobs)])
    started = time.monotonic()
    for _ in range(2):
        children.start("soniq_worker", "--concurrency", "2", **QUIET)
    wait_until(lambda: Job.objects.filter(status="done").count() == jobs, 90, "every job done")
    claims = sorted(row.timestamp() for row in Job.objects.values_list("claimed_at", flat=True))
    assert max(sum(1 for c in claims if t - 1 < c <= t) for t in claims) <= rate
    # Reached: the workers look again at the window's pace, not every POLL_INTERVAL.
    assert claims[-1] - claims[0] < (jobs / rate) + 1.5, [round(c - claims[0], 2)
                                                           for c in claims]
    assert time.monotonic() - started < 60
