"""Worker processes whose database is a PgBouncer transaction pool.

- three workers drain 2,000 jobs, each run and completed exactly once;
- with ``SONIQ["LISTEN_DATABASE"]`` naming a session-mode pool, a job
  enqueued through the transaction pool starts within milliseconds;
- without it, the worker's start-up self-test finds that NOTIFY does not
  reach its LISTEN (PgBouncer hands the LISTEN's server connection to other
  clients), says so, polls every 0.5 s instead of every ``POLL_INTERVAL``,
  and leaves no LISTEN behind on a pooled server connection.
"""

import signal
import statistics
import time
from collections import Counter

import psycopg
import pytest

from soniq_django import bulk_enqueue
from soniq_django.models import DeadLetterJob, Job
from soniq_django.models import Worker as WorkerRow
from soniq_django.producer.request import JobRequest
from tests.support.pgbouncer import pool_hears
from tests.support.workers import wait_until

# Processes behind PgBouncer: run in the Django 5.2 passes only.
pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True),
              pytest.mark.version_independent]

LISTENING = "listening for new jobs"
DEAF = "does not hear NOTIFY"


def test_three_workers_drain_2000_jobs_through_pgbouncer_exactly_once(processes, run_log):
    total = 2000
    ids = {str(job_id) for job_id in bulk_enqueue(
        [JobRequest("tests.worker.ok", {"n": n}) for n in range(total)])}
    started = time.monotonic()
    children = [processes.worker("--concurrency", "2", "--burst", HEARTBEAT_SECONDS=1,
                                 POLL_INTERVAL=0.2) for _ in range(3)]
    codes = [child.wait(timeout=90) for child in children]
    elapsed = time.monotonic() - started
    assert codes == [0, 0, 0], [child.log()[-2000:] for child in children]

    rows = {str(r["id"]): r for r in Job.objects.values("id", "status", "attempts",
                                                        "claim_generation", "result")}
    assert set(rows) == ids and not DeadLetterJob.objects.exists()
    assert {(r["status"], r["attempts"], r["claim_generation"]) for r in rows.values()} == {
        ("done", 1, 1)}
    starts = Counter(event.job_id for event in run_log.events("start"))
    assert set(starts) == ids and set(starts.values()) == {1}
    completions = Counter(job_id for child in children for job_id in child.done_lines())
    assert set(completions) == ids and set(completions.values()) == {1}
    per_worker = Counter(row["result"]["pid"] for row in rows.values())
    assert len(per_worker) >= 2, per_worker
    print(f"\n2000 jobs / 3 workers x 2 through PgBouncer: {elapsed:.1f} s; "
          f"per worker {sorted(per_worker.values())}")


def _latencies(bouncer, run_log, samples: int) -> list[float]:
    """Seconds from each enqueue (through the transaction pool) to its handler's start.

    One job first, not counted: the worker's start-up jitter is over once it ran.
    """
    found = []
    # psycopg prepares a statement run five times, which no transaction pool keeps: not here.
    with psycopg.connect(bouncer.url("soniq_tx"), autocommit=True,
                         prepare_threshold=None) as producer:
        for n in range(-1, samples):
            time.sleep(0.02 + (n % 5) * 0.1)  # the worker idles again; sent at varied phases
            sent = time.time()
            (job_id,) = producer.execute("SELECT soniq_enqueue('tests.worker.ok', %s::jsonb)",
                                         [f'{{"n": {n}}}']).fetchone()
            (start,) = run_log.wait_for("start", job_id, timeout=15)
            found.append(start.at - sent)
    return found[1:]


def _summary(values: list[float]) -> str:
    ordered = sorted(values)
    return (f"p50 {statistics.median(ordered) * 1000:.1f} ms, "
            f"p90 {ordered[int(len(ordered) * 0.9)] * 1000:.1f} ms, "
            f"max {ordered[-1] * 1000:.1f} ms")


def test_with_the_listen_database_a_job_starts_within_milliseconds(processes, bouncer, run_log):
    worker = processes.worker(POLL_INTERVAL=5, LISTEN_DATABASE="listen", env={
        "SONIQ_TEST_LISTEN_DATABASE_URL": bouncer.url("soniq_session")})
    wait_until(lambda: LISTENING in worker.log() or not worker.alive, 20,
               "the listener's self-test")
    assert LISTENING in worker.log() and DEAF not in worker.log(), worker.log()[-2000:]

    latencies = _latencies(bouncer, run_log, 30)
    print(f"\nenqueue -> start, LISTEN through a session pool: {_summary(latencies)}")
    assert statistics.median(latencies) < 0.050
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0


def test_without_it_the_worker_warns_polls_faster_and_leaves_no_listen_behind(
        processes, bouncer, run_log):
    worker = processes.worker(POLL_INTERVAL=5)
    wait_until(lambda: DEAF in worker.log() or not worker.alive, 20,
               "the listener's self-test to fail")
    log = worker.log()
    assert "SONIQ['LISTEN_DATABASE']" in log and "polling every 0.5 s" in log, log[-2000:]

    latencies = _latencies(bouncer, run_log, 12)
    print(f"\nenqueue -> start, LISTEN through the transaction pool: {_summary(latencies)}")
    assert max(latencies) < 1.5 and statistics.median(latencies) < 0.6  # not POLL_INTERVAL (5 s)
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    assert WorkerRow.objects.get(pid=worker.pid).status == "stopped"
    assert not pool_hears(bouncer.url("soniq_tx"), "soniq_new_job")
