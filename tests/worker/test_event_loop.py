"""``async def`` handlers run on the worker's one event loop (worker/eventloop.py).

Every async job of a worker runs on the same loop: at concurrency 1 on the
one job thread, which runs the loop itself; above, on the loop's own thread
(the main loop hands a round's async jobs to it; a completion is settled
there, every other final write on a job thread). Sync handlers keep their
job threads.
"""

import pytest

from soniq_django import enqueue
from soniq_django.models import DeadLetterJob, Job
from tests.support.workers import run_burst
from tests.testapp import jobs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fast(settings):
    settings.SONIQ = {"RETRY_BASE_SECONDS": 0, "LEASE_SECONDS": 5, "HEARTBEAT_SECONDS": 0.1,
                      "POLL_INTERVAL": 0.2}
    jobs.TOGETHER.clear()


@pytest.mark.parametrize("concurrency", [1, 4])
def test_every_async_job_of_a_worker_runs_on_its_one_event_loop(concurrency):
    expected = concurrency  # at 4, the four wait for each other on the one loop
    ids = [enqueue("tests.worker.async_together", {"expected": expected}) for _ in range(8)]
    assert run_burst(concurrency=concurrency) == 0
    rows = [Job.objects.get(id=job_id) for job_id in ids]
    assert {row.status for row in rows} == {"done"}
    assert len({row.result["loop"] for row in rows}) == 1  # one loop, not one per job
    assert {row.result["thread"] for row in rows} == {
        "soniq-job_0" if concurrency == 1 else "soniq-asyncio"}
    assert all(row.result["met"] for row in rows)  # at 4: they ran side by side


@pytest.mark.parametrize("concurrency", [1, 3])
def test_an_async_failure_is_retried_then_dead_lettered(concurrency):
    ids = [enqueue("tests.worker.async_fails", {}, max_attempts=2) for _ in range(3)]
    assert run_burst(concurrency=concurrency) == 0
    for job_id in ids:
        assert not Job.objects.filter(id=job_id).exists()
        letter = DeadLetterJob.objects.get(id=job_id)
        assert letter.attempts == 2 and letter.dead_letter_reason == "max_retries_exceeded"
        assert "ValueError: async boom" in letter.last_error


def test_an_async_job_over_its_timeout_on_the_shared_loop_is_retried(settings):
    settings.SONIQ = {**settings.SONIQ, "JOB_TIMEOUT_SECONDS": 0.3}
    slow = enqueue("tests.worker.async_sleep", {"seconds": 60}, max_attempts=2)
    quick = [enqueue("tests.worker.async_ok", {"n": n}) for n in range(5)]
    assert run_burst(concurrency=3, timeout=60) == 0  # 2 x 60 s of sleep would not fit
    letter = DeadLetterJob.objects.get(id=slow)
    assert letter.attempts == 2 and "timed out after 0.3 s" in letter.last_error
    assert {Job.objects.get(id=job_id).status for job_id in quick} == {"done"}


def test_sync_and_async_jobs_of_one_worker_each_run_where_they_belong():
    sync_ids = [enqueue("tests.worker.ok", {"n": n}) for n in range(4)]
    async_ids = [enqueue("tests.worker.async_together", {"expected": 1}) for _ in range(4)]
    assert run_burst(concurrency=4) == 0
    assert {Job.objects.get(id=job_id).status for job_id in sync_ids + async_ids} == {"done"}
    assert {Job.objects.get(id=job_id).result["thread"] for job_id in async_ids} == {
        "soniq-asyncio"}
