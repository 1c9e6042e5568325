"""A large round's completions on the partner connection, at once with its claim (decision 0042).

On PostgreSQL a worker with several slots writes a round of at least
``SPLIT_AT`` completions and as many claims as two transactions at once:
the completions on its partner connection (its own thread), the claim on
the shared one. Each is fenced, committed, recovered and reported as a
call of its own. SQLite has one writer at a time: no partner there, every
round in one call as before. ``SPLIT_AT`` is lowered here so that small
drains split their rounds.
"""

import logging
import threading

import pytest
from django.db import connection

from soniq_django import bulk_enqueue
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.models import Job
from soniq_django.producer.request import JobRequest
from soniq_django.worker import Worker, writes
from tests.support.workers import WorkerThread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast")]

JOBS = 120


@pytest.fixture
def split_small(monkeypatch):
    monkeypatch.setattr(writes, "SPLIT_AT", 2)


def _queued(count: int = JOBS) -> list:
    return bulk_enqueue([JobRequest("tests.worker.ok", {"n": n}) for n in range(count)])


def _splits(worker: Worker) -> list[int]:
    """Count the calls made on ``worker``'s partner connection (their completions each)."""
    calls: list[int] = []
    if worker.partner is None:
        return calls
    start = worker.partner.start

    def counted(call):
        calls.append(len(call.args[0]))  # partial(self._call, completions, [], source)
        return start(call)

    worker.partner.start = counted  # type: ignore[method-assign]
    return calls


def test_a_split_drain_runs_every_job_once_and_records_every_completion(
        run_log, caplog, split_small):
    ids = _queued()
    worker = Worker(burst=True, concurrency=8)
    splits = _splits(worker)
    threads = set()
    complete = worker.source.complete_many_owned

    def noting_thread(completions, **kwargs):
        threads.add(threading.current_thread().name)
        return complete(completions, **kwargs)

    worker.source.complete_many_owned = noting_thread
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        assert WorkerThread(worker).start().join(timeout=60) == 0
    rows = Job.objects.filter(id__in=ids)
    assert sorted((r.status, r.attempts) for r in rows) == [("done", 1)] * JOBS
    assert set(run_log.starts_per_job().values()) == {1}
    assert worker.claimed_count == JOBS
    assert "not recorded" not in caplog.text
    assert caplog.text.count(" done after ") == JOBS
    if connection.vendor == "sqlite":  # one writer: every round in one call, no partner
        assert worker.partner is None and not splits
        assert "soniq-partner" not in threads
    else:
        assert splits and min(splits) >= 2  # rounds of two or more completions went there
        assert "soniq-partner" in threads  # and the last ones, with no claim, on the shared one
        assert worker.partner.connection._wrapper.connection is None  # closed at the end


def test_small_rounds_stay_in_one_call(run_log):
    ids = _queued(12)
    worker = Worker(burst=True, concurrency=4)  # rounds of at most 4: under SPLIT_AT (16)
    splits = _splits(worker)
    assert WorkerThread(worker).start().join(timeout=60) == 0
    assert sorted((r.status, r.attempts) for r in Job.objects.filter(id__in=ids)) == \
        [("done", 1)] * 12
    assert not splits
    if worker.partner is not None:  # never opened
        assert worker.partner.connection._wrapper is None


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the partner is PostgreSQL's")
def test_completions_whose_answer_was_lost_on_the_partner_are_recovered(
        run_log, caplog, split_small):
    ids = _queued()
    worker = Worker(burst=True, concurrency=8)
    complete, lost = worker.source.complete_many_owned, []

    def committed_but_unanswered(completions, **kwargs):
        answers = complete(completions, **kwargs)
        if threading.current_thread().name == "soniq-partner" and not lost:
            lost.append(len(completions))  # committed, then the connection died
            raise SoniqError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "unavailable")
        return answers

    worker.source.complete_many_owned = committed_but_unanswered
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        assert WorkerThread(worker).start().join(timeout=60) == 0
    assert lost and lost[0] >= 2
    rows = Job.objects.filter(id__in=ids)
    assert sorted((r.status, r.attempts) for r in rows) == [("done", 1)] * JOBS
    assert set(run_log.starts_per_job().values()) == {1}
    assert "recovering" in caplog.text
    assert "not recorded" not in caplog.text  # found done under their claims
    assert caplog.text.count(" done after ") == JOBS


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the partner is PostgreSQL's")
def test_a_partner_call_that_raised_loses_no_claimed_job(run_log, caplog, split_small):
    ids = _queued()
    worker = Worker(burst=True, concurrency=8)
    complete, broken = worker.source.complete_many_owned, []

    def broken_once(completions, **kwargs):
        if threading.current_thread().name == "soniq-partner" and not broken:
            broken.append([fence.job_id for fence, _ in completions])
            raise RuntimeError("a bug on the partner's thread")  # before writing anything
        return complete(completions, **kwargs)

    worker.source.complete_many_owned = broken_once
    with caplog.at_level(logging.INFO, logger="soniq_django.worker"):
        assert WorkerThread(worker).start().join(timeout=60) == 0
    unwritten = set(broken[0])
    assert len(unwritten) >= 2
    assert "worker error while completing" in caplog.text
    # Every job ran once, the round's claims too; the completions that were never
    # written stay under this worker's claim until their leases lapse.
    assert set(run_log.starts_per_job().values()) == {1}
    assert len(run_log.starts_per_job()) == JOBS
    for row in Job.objects.filter(id__in=ids):
        if str(row.id) in unwritten:
            assert (row.status, row.claim_owner) == ("processing", worker.worker_id)
        else:
            assert (row.status, row.attempts) == ("done", 1)
    assert caplog.text.count(": done not recorded;") == len(unwritten)
