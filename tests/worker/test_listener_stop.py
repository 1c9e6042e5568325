"""A stopping worker does not wait for its listener.

The listener waits for notifications in slices (``LISTEN_SLICE_SECONDS``)
and looked at ``stop`` only between them, so every burst worker, and every
worker told to stop by SIGTERM, spent up to a slice (half a second) in
``thread.join`` after its last job. Now the worker interrupts the wait with
a NOTIFY on the listener's own channel. The tests make the slice a minute
long: without the interrupt the listener would outlive them. The interrupt
connects with a short timeout of its own: a server that accepts the
connection and never answers cannot hold a stopping worker.

PostgreSQL only: on SQLite there is no listener.
"""

import socket
import threading
import time

import pytest
from django.db import connections

from soniq_django.worker import Worker, wakeup
from soniq_django.worker.wakeup import Listener
from tests.support.workers import WorkerThread, wait_until

SILENT = "listener_stop_silent"

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


@pytest.fixture
def silent_alias():
    """An alias like ``default`` whose server accepts the TCP connection and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # the kernel completes the handshakes; nobody reads
    settings = dict(connections.settings["default"], HOST="127.0.0.1",
                    PORT=server.getsockname()[1])
    settings["OPTIONS"] = {k: v for k, v in (settings.get("OPTIONS") or {}).items()
                           if k != "connect_timeout"}  # no limit of its own
    connections.settings[SILENT] = settings
    try:
        yield SILENT
    finally:
        if hasattr(connections._connections, SILENT):
            delattr(connections._connections, SILENT)
        del connections.settings[SILENT]
        server.close()


def test_an_interrupt_gives_up_on_a_server_that_does_not_answer(silent_alias):
    stop, wake = threading.Event(), threading.Event()
    listener = Listener("default", None, wake, stop)
    listener.start()
    try:
        assert listener.ready.wait(10)
        listener.using = silent_alias  # where interrupt() sends: now a server that hangs
        stop.set()
        started = time.monotonic()
        sender = threading.Thread(target=listener.interrupt, daemon=True)
        sender.start()
        sender.join(10)
        assert not sender.is_alive(), "interrupt() waited for a silent server without limit"
        assert time.monotonic() - started < wakeup.INTERRUPT_CONNECT_SECONDS + 3
    finally:
        stop.set()
        listener.join(10)
    assert not listener.is_alive()  # it saw stop at the end of its slice
