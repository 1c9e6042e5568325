"""A stopping worker does not wait for its listener.

The listener waits for notifications in slices (``LISTEN_SLICE_SECONDS``)
and looked at ``stop`` only between them, so every burst worker, and every
worker told to stop by SIGTERM, spent up to a slice (half a second) in
``thread.join`` after its last job. Now the worker interrupts the wait with
a NOTIFY on the listener's own channel. The tests make the slice a minute
long: without the interrupt the listener would outlive them.

PostgreSQL only: on SQLite there is no listener.
"""

import threading
import time

import pytest

from soniq_django.worker import Worker, wakeup
from soniq_django.worker.wakeup import Listener
from tests.support.workers import WorkerThread, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgresql_only,
              pytest.mark.usefixtures("fast")]


@pytest.fixture
def long_slices(monkeypatch):
    monkeypatch.setattr(wakeup, "LISTEN_SLICE_SECONDS", 60.0)


def test_interrupt_ends_the_listeners_wait_at_once(long_slices):
    stop, wake = threading.Event(), threading.Event()
    listener = Listener("default", None, wake, stop)
    listener.start()
    try:
        assert listener.ready.wait(10), "the listener did not start listening"
        time.sleep(0.2)  # inside its (minute-long) wait for notifications
        stop.set()
        listener.interrupt()
        listener.join(10)
        assert not listener.is_alive()
    finally:
        stop.set()
        listener.interrupt()
        listener.join(70)


def test_a_stopped_listener_ignores_interrupt():
    stop, wake = threading.Event(), threading.Event()
    listener = Listener("default", None, wake, stop)
    listener.interrupt()  # never started: nothing to end, nothing raised
    assert not listener.is_alive()


def test_a_worker_told_to_stop_does_not_wait_for_its_listener(long_slices):
    worker = Worker()
    running = WorkerThread(worker).start()
    try:
        wait_until(lambda: worker.listener is not None and worker.listener.ready.is_set(),
                   timeout=10, what="the listener listening")
        time.sleep(0.2)  # the listener is inside its (minute-long) wait
        started = time.monotonic()
        worker.request_stop()  # what SIGTERM does
        assert running.join(30) == 0
        took = time.monotonic() - started
    finally:
        worker.request_stop()
    # Without the interrupt run() would give up joining the listener after
    # 5 s and leave it waiting.
    assert not worker.listener.is_alive()
    assert took < 5, took


def test_a_job_enqueued_while_listening_still_wakes_the_worker():
    stop, wake = threading.Event(), threading.Event()
    listener = Listener("default", None, wake, stop)
    listener.start()
    try:
        assert listener.ready.wait(10)
        wake.clear()
        from soniq_django import enqueue

        enqueue("tests.noop", {})
        assert wake.wait(10), "the NOTIFY of an enqueue did not wake the worker"
        assert listener.is_alive()
    finally:
        stop.set()
        listener.interrupt()
        listener.join(10)
    assert not listener.is_alive()
