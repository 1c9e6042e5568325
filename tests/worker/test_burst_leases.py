"""``--burst`` and the jobs other workers' claims still hold.

A burst worker that finds nothing eligible may still share its queues with
a worker that died holding jobs under live leases: they come back only when
those leases lapse. By default it exits and its last log line counts them;
with ``wait_for_leases`` (``--wait-for-leases``) it waits, and runs them.
"""

import datetime as dt
import logging
import time

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from soniq_django import enqueue, pause_queue
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from soniq_django.worker import Worker
from tests.support.owned import nonce, rewrite
from tests.support.workers import WorkerThread

pytestmark = pytest.mark.django_db(transaction=True)

FAST = {"LEASE_SECONDS": 1, "HEARTBEAT_SECONDS": 0.1, "POLL_INTERVAL": 0.2}


@pytest.fixture(autouse=True)
def fast(settings):
    settings.SONIQ = dict(FAST)


def held_by_a_dead_peer(settings, *, lease: float, queue: str = "default"):
    """A job claimed by a worker that then died: its lease runs for ``lease`` seconds more."""
    job_id = enqueue("tests.worker.ok", {"n": 1}, queue=queue)
    settings.SONIQ = {**FAST, "LEASE_SECONDS": lease}
    claimed = OwnedJobSource().claim_next_owned("dead-peer", claim_token=nonce())
    settings.SONIQ = dict(FAST)
    assert claimed.job_id == job_id
    return job_id


def last_line(caplog) -> str:
    return [r.getMessage() for r in caplog.records if r.name == "soniq_django.worker"][-1]


def test_burst_exits_and_its_last_line_counts_the_jobs_other_workers_hold(settings, caplog):
    job_id = held_by_a_dead_peer(settings, lease=60)
    worker = Worker(burst=True)
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        started = time.monotonic()
        assert WorkerThread(worker).start().join() == 0
    assert time.monotonic() - started < 5
    assert Job.objects.get(id=job_id).status == "processing"  # still the dead peer's
    assert last_line(caplog) == (
        f"worker {worker.worker_id[:8]} stopped after 0 jobs; other workers still hold 1 job(s) "
        "of its queues (1 under a lease)")


def test_wait_for_leases_runs_a_dead_peers_jobs_once_their_leases_lapse(settings, caplog):
    job_id = held_by_a_dead_peer(settings, lease=1.5)
    worker = Worker(burst=True, wait_for_leases=True)
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        started = time.monotonic()
        assert WorkerThread(worker).start().join(timeout=30) == 0
    assert time.monotonic() - started >= 1.0  # it waited for the lease
    row = Job.objects.get(id=job_id)
    assert (row.status, row.claim_owner, row.attempts) == ("done", worker.worker_id, 2)
    assert last_line(caplog).endswith(
        "stopped after 1 jobs (1 done); other workers still hold 0 job(s) of its queues "
        "(0 under a lease)")


def test_wait_for_leases_minds_only_its_own_queues(settings):
    job_id = held_by_a_dead_peer(settings, lease=60, queue="elsewhere")
    started = time.monotonic()
    assert WorkerThread(Worker(burst=True, wait_for_leases=True, queues=["default"])
                        ).start().join() == 0
    assert time.monotonic() - started < 5
    assert Job.objects.get(id=job_id).status == "processing"


def test_wait_for_leases_does_not_wait_for_a_claim_without_a_lease(settings, caplog):
    # Soniq's own workers claim without a lease: nothing here can end such a claim.
    job_id = enqueue("tests.worker.ok")
    rewrite(job_id, status="processing", attempts=1, lease_expires_at=None, claim_owner=None)
    worker = Worker(burst=True, wait_for_leases=True)
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        started = time.monotonic()
        assert WorkerThread(worker).start().join() == 0
    assert time.monotonic() - started < 5
    assert last_line(caplog).endswith("still hold 1 job(s) of its queues (0 under a lease)")


def test_a_stop_ends_the_wait(settings):
    held_by_a_dead_peer(settings, lease=60)
    running = WorkerThread(Worker(burst=True, wait_for_leases=True)).start()
    time.sleep(1.0)
    assert running.thread.is_alive()  # still waiting
    assert running.stop(timeout=10) == 0


def test_the_command_waits_with_burst_and_refuses_the_flag_without_it(settings):
    with pytest.raises(CommandError, match="--wait-for-leases needs --burst"):
        call_command("soniq_worker", "--wait-for-leases")
    job_id = held_by_a_dead_peer(settings, lease=1)
    call_command("soniq_worker", "--burst", "--wait-for-leases")
    assert Job.objects.get(id=job_id).status == "done"


def test_the_last_line_counts_the_queued_jobs_a_burst_worker_leaves(caplog):
    # "Exits when no job is due": a retry waiting for its backoff, a run_at
    # later and a paused queue's jobs stay queued, and its last line says so.
    later = timezone.now() + dt.timedelta(hours=1)
    waiting = [enqueue("tests.worker.ok", {"n": n}, run_at=later) for n in (1, 2)]
    paused = [enqueue("tests.worker.ok", {"n": 3}, queue="held"),
              enqueue("tests.worker.ok", {"n": 4}, queue="held", run_at=later)]
    pause_queue("held")
    ran = enqueue("tests.worker.ok", {"n": 5})
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        assert WorkerThread(Worker(burst=True)).start().join() == 0
    assert Job.objects.get(id=ran).status == "done"
    assert set(Job.objects.filter(status="queued").values_list("id", flat=True)) == {
        *waiting, *paused}
    assert last_line(caplog).endswith(
        "other workers still hold 0 job(s) of its queues (0 under a lease); left queued: "
        "2 waiting for a later time (a retry's backoff, a run_at or a deferral), "
        "2 in paused queues")


def test_a_worker_of_some_queues_counts_only_theirs(caplog):
    later = timezone.now() + dt.timedelta(hours=1)
    enqueue("tests.worker.ok", {"n": 1}, queue="elsewhere", run_at=later)
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        assert WorkerThread(Worker(burst=True, queues=["mine"])).start().join() == 0
    assert last_line(caplog).endswith("(0 under a lease)")
