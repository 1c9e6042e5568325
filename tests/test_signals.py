"""The signals of soniq_django.signals: each sent once, with its documented arguments.

Workers run in a thread of this process (``Worker(...).run()``, as
tests/worker/test_worker.py does) against committed rows, so receivers
connected here hear them. docs/metrics.md lists the arguments these tests check.
"""

import datetime as dt
import logging
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from unittest import mock

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from soniq_django import abulk_enqueue, aenqueue, bulk_enqueue, enqueue, signals
from soniq_django.models import Job
from soniq_django.owned import OwnedJobSource
from soniq_django.producer.request import JobRequest
from soniq_django.registry import get_handler
from soniq_django.worker import Worker
from tests.support.owned import nonce, rewrite
from tests.support.workers import FAST, WorkerThread, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ALL = (signals.job_enqueued, signals.job_started, signals.job_finished, signals.job_refused,
       signals.lease_lost, signals.worker_heartbeat)

#: The keyword arguments each signal is documented to carry (docs/metrics.md).
ARGUMENTS = {
    signals.job_enqueued: {"job_id", "job_name", "queue", "priority", "scheduled_at", "using",
                           "bulk"},
    signals.job_started: {"job_id", "job_name", "queue", "attempt", "max_attempts", "worker_id",
                          "using"},
    signals.job_finished: {"job_id", "job_name", "queue", "outcome", "attempt", "max_attempts",
                           "duration", "error", "exception", "dead_letter_reason", "retry_in",
                           "worker_id", "using"},
    signals.job_refused: {"job_id", "job_name", "queue", "outcome", "attempt", "generation",
                          "duration", "worker_id", "using"},
    signals.lease_lost: {"job_id", "job_name", "queue", "attempt", "generation", "worker_id",
                         "using"},
    signals.worker_heartbeat: {"worker_id", "using", "state", "in_flight"},
}


class Heard:
    """A receiver of every signal that keeps what it heard, from whichever thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple[object, object, dict]] = []

    def __call__(self, signal, sender, **kwargs) -> None:
        assert set(kwargs) == ARGUMENTS[signal], (set(kwargs) ^ ARGUMENTS[signal])
        with self.lock:
            self.calls.append((signal, sender, kwargs))

    def of(self, signal, job_id=None) -> list[dict]:
        with self.lock:
            return [dict(kwargs, sender=sender) for heard, sender, kwargs in self.calls
                    if heard is signal and (job_id is None or kwargs.get("job_id") == job_id)]


@pytest.fixture
def heard(settings):
    settings.SONIQ = dict(FAST)
    receiver = Heard()
    for signal in ALL:
        signal.connect(receiver, weak=False, dispatch_uid="tests.heard")
    yield receiver
    for signal in ALL:
        signal.disconnect(dispatch_uid="tests.heard")


def burst(concurrency: int = 1) -> Worker:
    worker = Worker(burst=True, concurrency=concurrency)
    assert WorkerThread(worker).start().join() == 0
    return worker


# Enqueue -------------------------------------------------------------------------


def test_enqueue_sends_job_enqueued_after_the_insert_with_its_arguments(heard):
    seen_rows = []
    signals.job_enqueued.connect(
        lambda job_id, **_: seen_rows.append(Job.objects.filter(id=job_id).exists()),
        weak=False, dispatch_uid="tests.row_exists")
    try:
        job_id = enqueue("tests.add", {"a": 1}, queue="sums", priority=7)
    finally:
        signals.job_enqueued.disconnect(dispatch_uid="tests.row_exists")
    [sent] = heard.of(signals.job_enqueued)
    assert sent == {"sender": "tests.add", "job_id": job_id, "job_name": "tests.add",
                    "queue": "sums", "priority": 7, "scheduled_at": None, "using": "default",
                    "bulk": False}
    assert seen_rows == [True]  # the row exists when the receiver runs


def test_a_scheduled_job_says_when_it_is_due(heard):
    due = timezone.now() + dt.timedelta(hours=1)
    enqueue("tests.add", {"a": 1}, run_at=due)
    [sent] = heard.of(signals.job_enqueued)
    assert sent["scheduled_at"] == due


def test_bulk_enqueue_sends_one_signal_per_job_in_request_order_marked_bulk(heard):
    ids = bulk_enqueue([JobRequest("tests.add", {"a": n}, queue=f"q{n}") for n in range(3)])
    sent = heard.of(signals.job_enqueued)
    assert [s["job_id"] for s in sent] == ids
    assert [s["queue"] for s in sent] == ["q0", "q1", "q2"]
    assert {s["bulk"] for s in sent} == {True}


def test_a_unique_job_that_meets_its_queued_twin_names_the_twin(heard):
    first = get_handler("tests.unique_report").enqueue(day="monday")
    again = get_handler("tests.unique_report").enqueue(day="monday")
    assert again == first
    assert [s["job_id"] for s in heard.of(signals.job_enqueued)] == [first, first]


def test_the_async_twins_send_job_enqueued_too(heard):
    async def scenario():
        one = await aenqueue("tests.add", {"a": 1})
        many = await abulk_enqueue([JobRequest("tests.add", {"a": 2})])
        return [one], many

    one, many = async_to_sync(scenario)()
    assert [(s["job_id"], s["bulk"]) for s in heard.of(signals.job_enqueued)] == [
        (one[0], False), (many[0], True)]


def test_enqueue_on_commit_sends_it_after_the_commit_and_never_after_a_rollback(heard):
    add = get_handler("tests.add")
    with transaction.atomic():
        job_id = add.enqueue_on_commit(a=1)
        assert heard.of(signals.job_enqueued) == []  # no row yet
    assert [s["job_id"] for s in heard.of(signals.job_enqueued)] == [job_id]
    with pytest.raises(RuntimeError), transaction.atomic():
        add.enqueue_on_commit(a=2)
        raise RuntimeError("roll back")
    assert len(heard.of(signals.job_enqueued)) == 1


# Each outcome ------------------------------------------------------------------------


@pytest.mark.parametrize("concurrency", [1, 3])  # the job thread completes; the main loop does
def test_a_job_that_returns_sends_started_then_finished_done(heard, concurrency):
    job_id = enqueue("tests.worker.ok", {"n": 1}, queue="default")
    worker = burst(concurrency)
    [start] = heard.of(signals.job_started, job_id)
    assert start == {"sender": "tests.worker.ok", "job_id": job_id,
                     "job_name": "tests.worker.ok", "queue": "default", "attempt": 1,
                     "max_attempts": 4, "worker_id": worker.worker_id, "using": "default"}
    [end] = heard.of(signals.job_finished, job_id)
    assert end["outcome"] == "done" and end["attempt"] == 1 and end["max_attempts"] == 4
    assert end["error"] is None and end["dead_letter_reason"] is None and end["retry_in"] is None
    assert end["exception"] is None
    assert end["worker_id"] == worker.worker_id and end["sender"] == "tests.worker.ok"
    assert 0 <= end["duration"] < 30
    assert heard.of(signals.job_refused) == []


@pytest.mark.parametrize("concurrency", [1, 3])  # the job thread runs the loop; its own thread
def test_an_async_job_on_the_workers_event_loop_sends_started_then_finished(heard, concurrency):
    ids = [enqueue("tests.worker.async_ok", {"n": n}) for n in range(4)]
    failing = enqueue("tests.worker.async_fails", {}, max_attempts=1)
    worker = burst(concurrency)
    for job_id in ids:
        [start] = heard.of(signals.job_started, job_id)
        assert start["worker_id"] == worker.worker_id and start["attempt"] == 1
        [end] = heard.of(signals.job_finished, job_id)
        assert end["outcome"] == "done"
    assert len(heard.of(signals.job_started, failing)) == 1
    [end] = heard.of(signals.job_finished, failing)
    assert end["outcome"] == "dead" and end["error"] == "ValueError: async boom"


def test_a_failing_job_sends_retry_each_time_then_dead_with_max_retries_exceeded(heard):
    job_id = enqueue("tests.worker.always_fails", {"message": "out of paper"}, max_attempts=None)
    burst()
    ends = heard.of(signals.job_finished, job_id)
    assert [e["outcome"] for e in ends] == ["retry", "retry", "dead"]  # retries=2: 3 attempts
    assert [e["attempt"] for e in ends] == [1, 2, 3]
    assert [e["dead_letter_reason"] for e in ends] == [None, None, "max_retries_exceeded"]
    assert all(isinstance(e["retry_in"], float) and e["retry_in"] >= 0 for e in ends[:2])
    assert ends[2]["retry_in"] is None
    # The exception's type and message, one line -- never the args (the message is the
    # handler's own text).
    assert {e["error"] for e in ends} == {"ValueError: out of paper"}
    assert {type(e["exception"]) for e in ends} == {ValueError}  # for Sentry's traceback
    assert len(heard.of(signals.job_started, job_id)) == 3


def test_a_permanent_failure_sends_dead_with_its_reason(heard):
    job_id = enqueue("tests.worker.permanent")
    burst()
    [end] = heard.of(signals.job_finished, job_id)
    assert (end["outcome"], end["dead_letter_reason"]) == ("dead", "permanent_failure")
    assert end["error"].startswith("PermanentFailure")


def test_a_cancelled_job_sends_cancelled(heard, run_log):
    job_id = enqueue("tests.worker.cooperative", {"seconds": 60})
    with WorkerThread(Worker()) as running:
        run_log.wait_for("start", job_id)
        assert OwnedJobSource().request_cancel(job_id) is True
        wait_until(lambda: heard.of(signals.job_finished, job_id), 10, "job_finished")
        assert running.stop() == 0
    [end] = heard.of(signals.job_finished, job_id)
    assert end["outcome"] == "cancelled" and end["error"] is None
    assert Job.objects.get(id=job_id).status == "cancelled"


def test_a_completion_the_fence_refuses_sends_job_refused_and_no_job_finished(heard, run_log,
                                                                              settings):
    # Heartbeats far apart: the worker cannot notice the change below before it completes,
    # so its completion reaches the database with a fence that no longer matches.
    settings.SONIQ = {**FAST, "LEASE_SECONDS": 60, "HEARTBEAT_SECONDS": 30}
    job_id = enqueue("tests.worker.sleep", {"seconds": 1.0})
    with WorkerThread(Worker(max_jobs=1)) as running:
        run_log.wait_for("start", job_id)
        generation = Job.objects.get(id=job_id).claim_generation
        rewrite(job_id, claim_token="b" * 32)  # as if another worker had re-claimed it
        run_log.wait_for("end", job_id)
        wait_until(lambda: heard.of(signals.job_refused, job_id), 10, "job_refused")
        assert running.stop() == 0
    [refused] = heard.of(signals.job_refused, job_id)
    assert refused["outcome"] == "done" and refused["generation"] == generation
    assert refused["attempt"] == 1 and refused["duration"] >= 1.0
    assert heard.of(signals.job_finished, job_id) == []
    assert Job.objects.get(id=job_id).result is None  # the stale write was stopped


def test_an_atomic_job_sends_finished_once_its_transaction_committed(heard, run_log):
    job_id = enqueue("tests.atomic.effect", {"fail_times": 1})
    burst()
    ends = heard.of(signals.job_finished, job_id)
    assert [(e["outcome"], e["attempt"]) for e in ends] == [("retry", 1), ("done", 2)]
    assert len(heard.of(signals.job_started, job_id)) == 2


@pytest.mark.postgresql_only  # SQLite's write lock keeps anyone from re-claiming mid-run
def test_an_atomic_completion_the_fence_refuses_sends_job_refused(heard, run_log, settings,
                                                                  tmp_path):
    # As tests/worker/test_atomic.py provokes it: another worker re-claims the job while
    # the run waits for a gate file, and heartbeats are too far apart to notice.
    settings.SONIQ = {**FAST, "LEASE_SECONDS": 30, "HEARTBEAT_SECONDS": 10}
    gate = tmp_path / "gate"
    job_id = enqueue("tests.atomic.effect", {"gate": str(gate)})
    with WorkerThread(Worker(max_jobs=1)) as running:
        run_log.wait_for("start", job_id)
        rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
        other = OwnedJobSource().claim_next_owned("another-worker", claim_token=nonce())
        assert other is not None and other.claim_fence.generation == 2
        gate.touch()
        wait_until(lambda: heard.of(signals.job_refused, job_id), 10, "job_refused")
        assert running.stop() == 0
    [refused] = heard.of(signals.job_refused, job_id)
    assert (refused["outcome"], refused["generation"]) == ("done", 1)
    assert heard.of(signals.job_finished, job_id) == []
    # The stale run wrote nothing: the new owner's completion is the one that applies.
    assert OwnedJobSource().complete_owned(other.claim_fence, {"by": "the new owner"}) is True


def test_a_lapsed_lease_sends_lease_lost_once(heard, run_log):
    job_id = enqueue("tests.worker.cooperative", {"seconds": 60})
    worker = Worker(max_jobs=1)
    with WorkerThread(worker) as running:
        run_log.wait_for("start", job_id)
        rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
        wait_until(lambda: heard.of(signals.lease_lost, job_id), 10, "lease_lost")
        run_log.wait_for("saw-cancel", job_id)
        assert running.stop() == 0
    [lost] = heard.of(signals.lease_lost, job_id)
    assert lost["worker_id"] == worker.worker_id and lost["attempt"] == 1
    assert heard.of(signals.job_finished, job_id) == []  # the old owner writes nothing


def test_each_heartbeat_sends_worker_heartbeat_from_the_worker(heard, run_log):
    job_id = enqueue("tests.worker.sleep", {"seconds": 0.6})
    worker = Worker()
    with WorkerThread(worker) as running:
        run_log.wait_for("start", job_id)
        wait_until(lambda: any(b["in_flight"] == 1 for b in heard.of(signals.worker_heartbeat)),
                   10, "a heartbeat with the job in flight")
        assert running.stop() == 0
    beats = heard.of(signals.worker_heartbeat)
    assert len(beats) >= 2
    assert {b["sender"] for b in beats} == {worker.worker_id} == {b["worker_id"] for b in beats}
    assert {b["state"] for b in beats} <= {"running", "stopping"} and beats[0]["state"] == "running"


# Receivers that fail, and none at all ---------------------------------------------------


def test_a_receiver_that_raises_is_logged_and_the_job_still_ends_done(heard, caplog):
    def broken(**_):
        raise ValueError("a broken receiver")

    for signal in (signals.job_enqueued, signals.job_started, signals.job_finished):
        signal.connect(broken, weak=False, dispatch_uid="tests.broken")
    try:
        job_id = enqueue("tests.worker.ok", {"n": 2})
        with caplog.at_level(logging.ERROR, logger="django.dispatch"):
            burst()
    finally:
        for signal in (signals.job_enqueued, signals.job_started, signals.job_finished):
            signal.disconnect(dispatch_uid="tests.broken")
    assert Job.objects.get(id=job_id).status == "done"
    assert [e["outcome"] for e in heard.of(signals.job_finished, job_id)] == ["done"]
    assert sum("a broken receiver" in str(r.exc_info[1]) for r in caplog.records
               if r.exc_info) >= 2  # job_started and job_finished, both logged


@contextmanager
def no_receivers():
    """No receiver on any soniq signal (importing soniq_django.metrics connects some)."""
    with ExitStack() as stack:
        for signal in ALL:
            stack.enter_context(mock.patch.object(signal, "receivers", []))
            signal.sender_receivers_cache.clear()
        yield
    for signal in ALL:
        signal.sender_receivers_cache.clear()


class Untouchable:
    """Fails on any attribute read: what a send site must not build arguments from."""

    def __getattr__(self, name):
        raise AssertionError(f"read {name!r} although nobody listens")


def test_without_receivers_no_send_site_builds_its_arguments():
    nothing = Untouchable()
    with no_receivers():
        signals.enqueued([nothing], [uuid.uuid4()], "default", bulk=False)
        signals.started(nothing, "w", "default")
        signals.finished(nothing, "done", worker_id="w", using="default", duration=0.0)
        signals.refused(nothing, "done", worker_id="w", using="default", duration=0.0)
        signals.lost(nothing, worker_id="w", using="default")
        signals.heartbeat("w", using="default", state="running", in_flight=0)


def test_jobs_run_the_same_with_no_receiver_at_all():
    with no_receivers():
        job_id = enqueue("tests.worker.ok", {"n": 3})
        burst()
    assert Job.objects.get(id=job_id).status == "done"


def _per_call(function, *args, calls: int = 100_000) -> float:
    """Seconds per call of ``function(*args)``: the best of five runs (timeit's rule)."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        for _ in range(calls):
            function(*args)
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def _empty(flight, worker_id, using) -> None:
    """The baseline: a call of the same shape that does nothing."""


def test_a_send_site_without_receivers_costs_about_an_empty_function_call():
    # What docs/metrics.md quotes: with nobody listening, a send site is a function call
    # and an empty-list check (about 60 ns here, against 36 ns for an empty call; ~1 us
    # when it builds its arguments and calls send_robust anyway). Measured against the
    # empty call in the same run, so a loaded machine slows both alike.
    flight = Untouchable()
    with no_receivers():
        baseline = min(_per_call(_empty, flight, "w", "default") for _ in range(3))
        cost = min(_per_call(signals.started, flight, "w", "default") for _ in range(3))
    assert cost < 5 * baseline, (f"{cost * 1e9:.0f} ns per send site with no receiver, "
                                 f"{baseline * 1e9:.0f} ns per empty call")
