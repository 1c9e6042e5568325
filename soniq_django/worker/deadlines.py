"""The deadline thread: each running job's time limit, enforced when it is up.

One thread per worker, whatever its concurrency: a heap of deadlines and a
``Condition`` it sleeps on until the earliest one (or until a new one comes
first). A job thread adds its run's deadline before the handler starts
(``watch``) and takes it away once the run is settled (``forget``).

At a deadline the thread takes the run's final write through the
completer (``time_out``: the same lock and hand-over as any final write), so
the worker's main loop writes the failure at once -- retried while attempts
remain, dead-lettered otherwise -- and the handler is told through its
context. It never writes and never waits for the database itself.

What the handler does then depends on what it is:

- an ``async def`` handler is cancelled at the same deadline, on its own
  event loop (execution.py);
- a cooperative one (``raise_if_cancelled``, ``wait_for_cancel``) stops;
- a plain function cannot be stopped: its thread runs on, and what it
  returns is discarded (its final write was taken). It keeps its slot until
  it returns, so a worker never runs more handler threads than its
  concurrency. ``STRAGGLER_SECONDS`` after the deadline, a handler still
  running is named in a warning, and its return in an info line.
"""

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .flight import InFlight
from .timeouts import TimeLimit

logger = logging.getLogger("soniq_django.worker")

#: How long after its deadline a handler still running is named in a warning.
STRAGGLER_SECONDS = 1.0
#: Forgotten entries the heap may hold before it is rebuilt without them (and half its size).
COMPACT_AFTER = 64


@dataclass(order=True)
class _Entry:
    when: float
    seq: int
    flight: InFlight | None = field(compare=False)
    """None once forgotten: left in the heap until it is popped or the heap is rebuilt."""
    limit: TimeLimit = field(compare=False)
    straggler: bool = field(default=False, compare=False)
    """A check that the handler came back after its deadline, rather than the deadline."""
    popped: bool = field(default=False, compare=False)
    """Taken off the heap by the thread, which is acting on it."""


class Deadlines:
    """The running jobs' deadlines; ``run()`` is the deadline thread.

    ``time_out(flight, error)`` takes a run's final write as a timeout
    failure and returns whether it did (``Completer.time_out``); it must
    not block. ``is_atomic``/``is_async`` say how a job name runs;
    ``concurrency`` is only for the log.

    Each run has at most one entry, in ``_by_run``: its deadline, then,
    once timed out with a plain function still running, its straggler
    check. An entry is the run's as long as ``_by_run`` holds it, so a
    ``forget`` that comes while the thread acts on it wins.
    """

    def __init__(self, *, time_out: Callable[[InFlight, str], bool], concurrency: int,
                 is_atomic: Callable[[str], bool], is_async: Callable[[str], bool]):
        self._time_out = time_out
        self._concurrency = concurrency
        self._is_atomic = is_atomic
        self._is_async = is_async
        self._changed = threading.Condition(threading.Lock())
        self._heap: list[_Entry] = []
        self._by_run: dict[tuple[str, int], _Entry] = {}
        self._late: dict[tuple[str, int], float] = {}  # deadlines of runs named as stragglers
        self._forgotten = 0
        self._closed = False
        self._seq = itertools.count()

    def __len__(self) -> int:
        """Entries in the heap, forgotten ones included (tests bound it)."""
        with self._changed:
            return len(self._heap)

    def watch(self, flight: InFlight, limit: TimeLimit | None) -> None:
        """Time ``flight`` out at its claim plus ``limit`` (None: it has no limit)."""
        if limit is not None:
            flight.watched = True
            with self._changed:
                self._add(_Entry(limit.deadline(flight.started), 0, flight, limit))

    def forget(self, flight: InFlight) -> None:
        """``flight``'s run is settled: drop its entry; say so if it came back late.

        A run without a time limit was never watched: nothing to do, no lock taken.
        """
        if not flight.watched:
            return
        with self._changed:
            entry = self._by_run.pop(flight.key, None)
            if entry is not None:
                self._drop(entry)
            late = self._late.pop(flight.key, None)
        if late is not None:
            logger.info("%s %s: its handler returned %.3fs after its timeout; what it returned "
                        "was discarded, and its slot is free again", flight.claimed.job_name,
                        flight.claimed.job_id, time.monotonic() - late)

    def close(self) -> None:
        """The worker is over: the thread ends (no more timeouts are taken)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def run(self) -> None:
        """Sleep until the earliest deadline; time its run out; until ``close()``."""
        while True:
            entry = self._next()
            if entry is None:
                return
            try:
                self._due(entry)
            except Exception:  # one run's trouble must not end every other run's limit
                logger.exception("worker error at a job's deadline (%s)", entry.limit.origin)

    # Under the lock -------------------------------------------------------

    def _add(self, entry: _Entry) -> None:
        assert entry.flight is not None
        entry.seq = next(self._seq)
        previous = self._by_run.get(entry.flight.key)
        if previous is not None:
            self._drop(previous)
        self._by_run[entry.flight.key] = entry
        heapq.heappush(self._heap, entry)
        if self._heap[0] is entry:  # sooner than the thread sleeps for
            self._changed.notify()

    def _drop(self, entry: _Entry) -> None:
        """``entry`` is no run's any more: marked, and the heap rebuilt once half is such."""
        if entry.popped:
            return
        entry.flight = None
        self._forgotten += 1
        if self._forgotten > COMPACT_AFTER and self._forgotten * 2 > len(self._heap):
            self._heap = [e for e in self._heap if e.flight is not None]
            heapq.heapify(self._heap)
            self._forgotten = 0

    def _owns(self, entry: _Entry) -> bool:
        return entry.flight is not None and self._by_run.get(entry.flight.key) is entry

    def _next(self) -> _Entry | None:
        """The next entry that is due, taken off the heap; None once closed."""
        with self._changed:
            while not self._closed:
                while self._heap and self._heap[0].flight is None:
                    heapq.heappop(self._heap)
                    self._forgotten -= 1
                if not self._heap:
                    self._changed.wait()
                    continue
                wait = self._heap[0].when - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                entry = heapq.heappop(self._heap)
                entry.popped = True
                return entry
            return None

    # The thread, outside the lock -------------------------------------------

    def _due(self, entry: _Entry) -> None:
        flight = entry.flight
        assert flight is not None
        key, name = flight.key, flight.claimed.job_name
        if entry.straggler:
            with self._changed:
                if not self._owns(entry):
                    return  # it came back meanwhile
                del self._by_run[key]
                self._late[key] = entry.when - STRAGGLER_SECONDS
            logger.warning("%s %s: its handler is still running %.1fs after it %s; a plain "
                           "function cannot be stopped, so its thread keeps one of this "
                           "worker's %d slot(s) until it returns, and what it returns is "
                           "discarded", name, flight.claimed.job_id, STRAGGLER_SECONDS,
                           entry.limit.error(), self._concurrency)
            return
        check = None
        with self._changed:
            if not self._owns(entry):
                return  # settled meanwhile
            if flight.done or flight.lost:  # settled, or no longer this worker's
                del self._by_run[key]
                return
            if not self._is_async(name):  # in place before the timeout: forget() may follow it
                check = _Entry(entry.when + STRAGGLER_SECONDS, 0, flight, entry.limit,
                               straggler=True)
                self._add(check)
            else:
                del self._by_run[key]
        if self._time_out(flight, entry.limit.error(atomic=self._is_atomic(name))):
            return
        # Its job thread is writing its own outcome: that one stands.
        if check is not None:
            with self._changed:
                if self._owns(check):
                    del self._by_run[key]
                    self._drop(check)
