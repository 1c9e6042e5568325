"""wait_for_job / await_job: woken by NOTIFY on PostgreSQL (polling on SQLite), on every end.

Real threads against committed rows: one waits, another finishes the job
(the owned API, the SQL functions a worker in another language calls, an
operator's cancel). The PostgreSQL wake-up is asserted well before any
re-read (RECHECK_SECONDS) or poll could have found the job.
"""

import asyncio
import threading
import time
import uuid

import pytest
from django.db import connection, connections

from soniq_django import await_job, enqueue, get_job, wait_for_job
from soniq_django import housekeeping, waiting
from soniq_django.errors import ConfigValidationError, ErrorCode, SoniqError, WaitTimeout
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from tests.support.owned import claim, nonce
from tests.support.workers import WorkerThread, soniq

pytestmark = [pytest.mark.django_db(transaction=True)]

PG = pytest.mark.postgresql_only  # LISTEN/NOTIFY and the SQL functions
#: A finish must wake the waiter well before this: not a re-read, a NOTIFY.
PG_WAKE_BOUND = 0.5
#: On SQLite the waiter polls (at most every POLL_SECONDS).
SQLITE_WAKE_BOUND = waiting.POLL_SECONDS + 0.5


@pytest.fixture(autouse=True)
def slow_rechecks(monkeypatch, settings):
    """Re-reads far apart, and workers that poll slowly: only a NOTIFY wakes a waiter fast."""
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", 10.0)
    soniq(settings, POLL_INTERVAL=10)


def wake_bound() -> float:
    return PG_WAKE_BOUND if connection.vendor == "postgresql" else SQLITE_WAKE_BOUND


class Waiter:
    """``wait_for_job`` on a thread of its own; when it returned, and what."""

    def __init__(self, job_id, timeout: float = 20.0):
        self.job_id, self.timeout = job_id, timeout
        self.info = self.error = None
        self.returned_at: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.info = wait_for_job(self.job_id, timeout=self.timeout)
        except BaseException as error:
            self.error = error
        finally:
            self.returned_at = time.monotonic()
            connections.close_all()

    def start(self, settle: float = 0.3) -> "Waiter":
        self.thread.start()
        time.sleep(settle)  # listening by now (PostgreSQL), polling (SQLite)
        assert self.returned_at is None, "the waiter returned before the job finished"
        return self

    def join(self):
        self.thread.join(self.timeout + 5)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error
        return self.info


def finished_by(waiter: Waiter, finish) -> float:
    """Run ``finish()`` (which commits the end of the job); how long the waiter took after it."""
    finish()
    finished_at = time.monotonic()
    waiter.join()
    return waiter.returned_at - finished_at


def test_a_waiter_is_woken_by_the_completion_with_its_result():
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok", {"n": 1})
    claimed = claim(source)
    waiter = Waiter(job_id).start()
    latency = finished_by(waiter, lambda: source.complete_owned(claimed.claim_fence,
                                                               result={"answer": 42}))
    assert latency < wake_bound()
    assert waiter.info.status == "done" and waiter.info.result == {"answer": 42}
    assert waiter.info == get_job(job_id)


def test_a_finished_job_is_returned_at_once():
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok")
    source.complete_owned(claim(source).claim_fence, result=7)
    started = time.monotonic()
    assert wait_for_job(job_id, timeout=0).result == 7
    assert time.monotonic() - started < 0.2


def test_past_the_timeout_wait_timeout_with_the_job_as_last_read():
    job_id = enqueue("tests.worker.ok")
    started = time.monotonic()
    with pytest.raises(WaitTimeout) as raised:
        wait_for_job(job_id, timeout=0.4)
    assert 0.4 <= time.monotonic() - started < 0.4 + wake_bound()
    assert isinstance(raised.value, SoniqError)
    assert raised.value.code is ErrorCode.WAIT_TIMEOUT
    assert raised.value.job.status == "queued" and raised.value.job.id == job_id
    assert str(job_id) not in str(raised.value)
    with pytest.raises(SoniqError) as unknown:
        wait_for_job(uuid.uuid4(), timeout=0)
    assert unknown.value.code is ErrorCode.WAIT_TIMEOUT and unknown.value.job is None


def test_a_cancel_wakes_the_waiter_with_status_cancelled():
    job_id = enqueue("tests.worker.ok")
    waiter = Waiter(job_id).start()
    assert finished_by(waiter, lambda: OwnedJobSource().request_cancel(job_id)) < wake_bound()
    assert waiter.info.status == "cancelled"


def test_a_dead_letter_wakes_the_waiter_with_its_reason_and_error():
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok")
    claimed = claim(source)
    waiter = Waiter(job_id).start()
    latency = finished_by(waiter, lambda: source.fail_owned(claimed.claim_fence, "card declined",
                                                           retry=False))
    assert latency < wake_bound()
    assert waiter.info.status == "dead_letter"
    assert waiter.info.dead_letter_reason == "permanent_failure"
    assert waiter.info.last_error == "card declined"


def test_a_failure_that_is_retried_does_not_end_the_wait():
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok", max_attempts=3)
    claimed = claim(source)
    source.fail_owned(claimed.claim_fence, "try again", retry=True, retry_delay=0)
    with pytest.raises(WaitTimeout) as raised:
        wait_for_job(job_id, timeout=0.3)
    assert raised.value.job.status == "queued"


def test_a_worker_run_wakes_the_waiter(settings):
    from soniq_django.worker import Worker

    job_id = enqueue("tests.worker.ok", {"n": 3})
    worker = WorkerThread(Worker(burst=True)).start()
    info = wait_for_job(job_id, timeout=20)
    worker.join()
    assert info.status == "done" and info.result["n"] == 3


@PG
def test_a_completion_through_the_sql_functions_wakes_the_waiter():
    """A worker in another language: soniq_claim_many and soniq_complete, its own connection."""
    job_id = enqueue("tests.worker.ok")
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT job_id::text, generation, token, queue FROM "
                       "soniq_claim_many('go-worker', ARRAY[%s])", [nonce()])
        [(claimed_id, generation, token, queue)] = cursor.fetchall()
    assert claimed_id == str(job_id)
    waiter = Waiter(job_id).start()

    def complete() -> None:
        with connections["default"].cursor() as cursor:
            cursor.execute("SELECT soniq_complete(%s, 'go-worker', %s, %s, %s, '\"from go\"')",
                           [claimed_id, generation, token, queue])
            assert cursor.fetchone() == (True,)

    assert finished_by(waiter, complete) < PG_WAKE_BOUND
    assert waiter.info.result == "from go"


@PG
def test_a_completion_nobody_waits_for_sends_no_notify():
    """The cost: a NOTIFY only for a job a waiter's row names."""
    from soniq_django.listen import new_connection

    source = OwnedJobSource()
    watched, unwatched = enqueue("tests.worker.ok"), enqueue("tests.worker.ok")
    listener = new_connection("default")
    try:
        for job_id in (watched, unwatched):
            listener.execute(f"LISTEN {waiting.channel(job_id)}")
        listener.execute("INSERT INTO soniq_job_waiters VALUES (%s, %s, now() + interval '1 minute')",
                         [watched, uuid.uuid4()])
        for _ in range(2):
            source.complete_owned(claim(source).claim_fence)
        heard = [(note.channel, note.payload) for note in listener.notifies(timeout=1.0)]
    finally:
        listener.close()
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM soniq_job_waiters WHERE job_id = %s", [watched])
    assert heard == [(waiting.channel(watched), "done")]


@PG
def test_a_lost_notify_is_made_up_for_by_the_re_read(monkeypatch):
    """No NOTIFY comes (here: the waiter's row is gone before the job finishes): the wait
    still ends at the next re-read, well within its timeout."""
    monkeypatch.setattr(waiting, "RECHECK_SECONDS", 0.5)
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok")
    claimed = claim(source)
    waiter = Waiter(job_id, timeout=20).start()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM soniq_job_waiters WHERE job_id = %s", [job_id])
        assert cursor.rowcount == 1
    latency = finished_by(waiter, lambda: source.complete_owned(claimed.claim_fence))
    assert latency < 0.5 + 0.5
    assert waiter.info.status == "done"


@PG
def test_a_lost_listening_connection_falls_back_to_polling(monkeypatch):
    from soniq_django import listen

    made = []
    monkeypatch.setattr(listen, "new_connection",
                        lambda *args, _new=listen.new_connection, **kwargs: made.append(
                            _new(*args, **kwargs)) or made[-1])
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok")
    claimed = claim(source)
    waiter = Waiter(job_id).start()
    with connection.cursor() as cursor:  # end the waiter's session, as a restart would
        cursor.execute("SELECT pg_terminate_backend(%s)", [made[0].info.backend_pid])
        assert cursor.fetchone() == (True,)
    time.sleep(0.2)
    latency = finished_by(waiter, lambda: source.complete_owned(claimed.claim_fence))
    assert latency < waiting.POLL_SECONDS + 0.5
    assert waiter.info.status == "done"


@PG
def test_the_waiters_row_goes_with_the_wait_and_lapsed_rows_are_deleted():
    job_id = enqueue("tests.worker.ok")
    with pytest.raises(WaitTimeout):
        wait_for_job(job_id, timeout=0.2)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM soniq_job_waiters WHERE job_id = %s", [job_id])
        assert cursor.fetchone() == (0,)
        cursor.execute("DELETE FROM soniq_job_waiters")  # not a model: no flush between tests
        cursor.execute("INSERT INTO soniq_job_waiters VALUES (%s, %s, now() - interval '1 s'), "
                       "(%s, %s, now() + interval '1 hour')",
                       [job_id, uuid.uuid4(), job_id, uuid.uuid4()])
    assert housekeeping.forget_lapsed_waiters("default") == 1


def test_await_job_is_the_async_twin():
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok")
    claimed = claim(source)

    async def main():
        waiting_for = asyncio.ensure_future(await_job(job_id, timeout=20))
        ticks = 0
        while not waiting_for.done() and ticks < 5:  # the loop runs on meanwhile
            await asyncio.sleep(0.05)
            ticks += 1
        assert ticks == 5
        await asyncio.to_thread(source.complete_owned, claimed.claim_fence, result="async")
        return await waiting_for

    info = asyncio.run(main())
    assert info.status == "done" and info.result == "async"
    with pytest.raises(SoniqError) as raised:
        asyncio.run(await_job(uuid.uuid4(), timeout=0.1))
    assert raised.value.code is ErrorCode.WAIT_TIMEOUT


def test_the_sync_call_inside_an_event_loop_names_its_twin():
    async def main():
        wait_for_job(uuid.uuid4(), timeout=0)

    with pytest.raises(SoniqError) as raised:
        asyncio.run(main())
    assert raised.value.code is ErrorCode.ASYNC_CONTEXT and "await_job" in raised.value.reason


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf"), True, "1", None,
                                     31 * 86400])
def test_a_bad_timeout_is_refused(timeout):
    with pytest.raises(ConfigValidationError):
        wait_for_job(uuid.uuid4(), timeout=timeout)
    with pytest.raises(ConfigValidationError):
        await_job(uuid.uuid4(), timeout=timeout)


def test_a_bad_id_is_refused():
    with pytest.raises(ConfigValidationError) as raised:
        wait_for_job("not-a-uuid", timeout=1)
    assert raised.value.code is ErrorCode.INVALID_OPTION
    assert not Job.objects.exists()


@PG
@pytest.mark.django_db(transaction=True, databases=["default", "server_binding"])
def test_a_listen_database_that_does_not_hear_the_jobs_database_is_found_and_polled(
        monkeypatch, settings, caplog):
    """The worker's rule (listen.py): a LISTEN that NOTIFY does not reach -- here
    LISTEN_DATABASE names another database of the server -- is found by the self-test;
    the wait warns naming the setting and polls, instead of waiting for a re-read."""
    monkeypatch.setattr(waiting, "_verdicts", {})
    monkeypatch.setattr(waiting, "_warned_deaf", set())
    soniq(settings, LISTEN_DATABASE="server_binding", POLL_INTERVAL=10)
    wrapper = connections["server_binding"]  # this thread's: the wait runs on this thread
    monkeypatch.setattr(wrapper, "settings_dict", {**wrapper.settings_dict, "NAME": "postgres"})
    source = OwnedJobSource()
    job_id = enqueue("tests.worker.ok")
    claimed = claim(source)
    finished_at = []

    def finish() -> None:
        time.sleep(waiting.PROBE_SECONDS + 0.5)
        try:
            source.complete_owned(claimed.claim_fence, result=1)
            finished_at.append(time.monotonic())
        finally:
            connections.close_all()

    thread = threading.Thread(target=finish)
    thread.start()
    with caplog.at_level("WARNING", logger="soniq_django"):
        info = wait_for_job(job_id, timeout=20)
    returned_at = time.monotonic()
    thread.join()
    assert info.status == "done"
    assert returned_at - finished_at[0] < waiting.POLL_SECONDS + 0.5  # not RECHECK_SECONDS
    [warning] = [r.getMessage() for r in caplog.records if "does not hear NOTIFY" in r.getMessage()]
    assert "'server_binding'" in warning and "SONIQ['LISTEN_DATABASE']" in warning
    assert waiting._verdicts[("server_binding", "default")][0] is False
