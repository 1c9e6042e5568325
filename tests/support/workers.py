"""Shared helpers for the worker tests: the run log, polling, in-process workers.

The fixtures built on them (``run_log``, ``fast``) are in tests/conftest.py.
"""

import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from django.db import connections

from soniq_django.worker import Worker


#: Worker settings for tests: no retry back-off, a short lease, quick heartbeats and polls.
FAST = {
    "RETRY_BASE_SECONDS": 0,
    "LEASE_SECONDS": 5,
    "HEARTBEAT_SECONDS": 0.1,
    "POLL_INTERVAL": 0.2,
}


def soniq(settings, **values) -> None:
    """``SONIQ`` for the test: ``FAST`` with ``values`` over it (``settings``: pytest-django's)."""
    settings.SONIQ = {**FAST, **values}


@dataclass(frozen=True)
class Event:
    """One line of the run log written by the test handlers (tests/testapp/jobs.py)."""

    kind: str
    job_id: str
    attempt: int
    pid: int
    at: float


class RunLog:
    """The file the test handlers append their events to (``SONIQ_TEST_RUN_LOG``)."""

    def __init__(self, path: Path):
        self.path = path

    def events(self, kind: str | None = None, job_id=None) -> list[Event]:
        if not self.path.exists():
            return []
        found = []
        # A handler's write may be in progress while we read (one O_APPEND
        # write is atomic against other writers, not against a reader): a
        # last line without its newline is not written yet.
        text = self.path.read_text()
        for line in text[:text.rfind("\n") + 1].splitlines():
            event_kind, event_job, attempt, pid, at = line.split()
            event = Event(event_kind, event_job, int(attempt), int(pid), float(at))
            if (kind is None or event.kind == kind) and (
                job_id is None or event.job_id == str(job_id)
            ):
                found.append(event)
        return found

    def starts_per_job(self) -> Counter:
        return Counter(event.job_id for event in self.events("start"))

    def wait_for(self, kind: str, job_id=None, count: int = 1, timeout: float = 20.0
                 ) -> list[Event]:
        """Poll until ``count`` events of ``kind`` (for ``job_id``) are logged."""
        return wait_until(
            lambda: (lambda found: found if len(found) >= count else None)(
                self.events(kind, job_id)
            ),
            timeout, f"{count} {kind!r} event(s) for {job_id or 'any job'}",
        )


def wait_until(condition, timeout: float, what: str, interval: float = 0.02):
    """Poll ``condition()`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


class WorkerThread:
    """Run ``Worker.run()`` in a thread; stop it (and make sure it stopped) on exit."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.code: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._body, name="test-worker", daemon=True)

    def _body(self) -> None:
        try:
            self.code = self.worker.run()
        except BaseException as error:  # reported by join()
            self.error = error
        finally:
            connections.close_all()

    def start(self) -> "WorkerThread":
        self.thread.start()
        return self

    def join(self, timeout: float = 30.0) -> int:
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.worker.abort()
            self.thread.join(5)
            raise AssertionError(f"the worker did not stop within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.code

    def stop(self, timeout: float = 30.0) -> int:
        self.worker.request_stop()
        return self.join(timeout)

    def __enter__(self) -> "WorkerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.thread.is_alive():
            # A failed test: stop cooperative handlers too, so no job thread
            # outlives the test (the interpreter would wait for it at exit).
            for flight in self.worker.flights.all():
                flight.context._cancel().set()
            self.worker.abort()
            self.thread.join(10)


def run_burst(timeout: float = 30.0, **options) -> int:
    """Run a burst worker to its end (in a thread, so a hang fails instead of blocking)."""
    return WorkerThread(Worker(burst=True, **options)).start().join(timeout)
