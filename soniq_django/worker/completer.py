"""The completer: the one owner of a worker's final writes, inline or batched (one interface).

Modelled on River's jobcompleter. Three threads talk to it, and it says
which of them writes what:

- ``settle(flight, outcome)`` -- on the job thread, once the handler
  returned. A failure, a dead letter or a cancel acknowledgement is written
  there and then. An atomic job's completion was written before, in the
  handler's own transaction (worker/atomic.py): it is only reported. A
  completion is where the two completers differ: the
  ``InlineCompleter`` (one slot) writes it on the job thread, in one
  transaction with the claim of the slot's next job, which the same thread
  then runs -- no hand-off between threads; the ``BatchCompleter`` (several
  slots) hands it to the main loop.
- ``time_out(flight, error)`` -- on the deadline thread (deadlines.py), at
  the run's deadline: takes the final write of a job past its time limit
  and hands it to the main loop. It never writes and never waits, so a
  slow database cannot hold up the other jobs' deadlines. The main loop
  writes the failure with a hold of the claim's queue slot, since the
  handler may run on; ``settle`` releases it once the handler returned.
- ``round(n)`` -- on the main loop: writes the timeouts handed over, then
  the completions handed over together with a claim of ``n`` jobs, in one
  call. Both completers claim through ``Writes.round``, the one claim path.

A job's final write is taken once, under ``flight.settled``: by the job
thread, or by the deadline thread for a timeout. Whoever takes it holds the lock
until the write is over, so the other side waits instead of racing it, and
a job is never forgotten while its outcome is still unwritten.

A taken write that waits -- handed to the main loop, or retried after a
lock or an outage -- keeps its lease: the heartbeat renews every flight
until it is forgotten here (heartbeat.py), so a round held up on the
database never lets the jobs it is about to complete lapse. Every write
and claim is bounded (``bounds.lock_wait()``, writes.py).
"""

import logging
import threading

from ..owned.types import MAX_CLAIM_BATCH
from .capacity import Slots
from .execution import Outcome, OutcomeKind
from .flight import Flights, InFlight
from .writes import Answer, Writes

logger = logging.getLogger("soniq_django.worker")


class Completer:
    """Settles each job's run; ``_complete`` (a completion) is what a subclass decides."""

    def __init__(self, *, writes: Writes, flights: Flights, slots: Slots, wake: threading.Event,
                 stopping: threading.Event, aborted: threading.Event):
        self._writes = writes
        self._flights = flights
        self._slots = slots
        self._wake = wake
        self._stopping = stopping
        self._aborted = aborted
        self._lock = threading.Lock()
        self._completions: list[InFlight] = []  # handed to the main loop (BatchCompleter)
        self._timeouts: list[tuple[InFlight, Outcome]] = []  # handed to the main loop
        self._closed = False

    @property
    def pending(self) -> int:
        """Final writes handed to the main loop and not yet made."""
        with self._lock:
            return len(self._completions) + len(self._timeouts)

    # The job thread ---------------------------------------------------

    def settle(self, flight: InFlight, outcome: Outcome | None) -> InFlight | None:
        """The handler returned ``outcome`` (None: the run itself failed): settle the job.

        Returns the job this slot runs next (an inline completion claimed
        it), or None: the slot is free again. After ``abort()`` nothing is
        written; the lease lapses.
        """
        progress = self._flights.progress
        if progress is not None and not (outcome is not None and outcome.written):
            progress.flush(flight.context)  # the last value reported, before the final write
        if outcome is not None and outcome.written:  # an atomic job's: made already
            try:
                self._writes.report_atomic(flight, outcome)
            except Exception:
                logger.exception("worker error while recording %s", flight.claimed.job_name)
            self._give_back_hold(flight)
            return self._run_on(flight)
        completion = False
        try:
            if outcome is not None and not self._aborted.is_set():
                completion = self._take(flight, outcome)
        except Exception:
            logger.exception("worker error while running %s", flight.claimed.job_name)
        self._give_back_hold(flight)
        if completion:
            return self._complete(flight)
        self._flights.finish(flight)
        self._free_slot()
        return None

    def _run_on(self, flight: InFlight) -> InFlight | None:
        """``flight``'s final write is made: forget it; the job its slot runs next, or None."""
        self._flights.finish(flight)
        self._free_slot()
        return None

    def _take(self, flight: InFlight, outcome: Outcome) -> bool:
        """Take the job's final write: make it here, unless it is a completion (True).

        Nothing to do when the timeout took it first. The lock is held
        through the write (see the module docstring).
        """
        with flight.settled:
            if flight.done:
                return False
            flight.done = True
            if outcome.kind is OutcomeKind.DONE and not flight.lost:
                flight.outcome = outcome
                return True
            self._writes.write_outcome(flight, outcome)
            return False

    def _complete(self, flight: InFlight) -> InFlight | None:
        """Write the completion of ``flight`` or hand it over; free the slot unless it runs on."""
        raise NotImplementedError

    def _give_back_hold(self, flight: InFlight) -> None:
        """The handler returned: release the queue slot its timeout held, if it did (once).

        A run without a time limit was never timed out: nothing to do, no lock
        taken. Otherwise ``flight.settled`` orders this after the timeout's
        write (which holds it throughout), so the hold is never released
        before it was taken. After ``abort()`` nothing is written: the hold
        lapses with its lease, as the worker's claims do.
        """
        if not flight.watched:
            return
        with flight.settled:
            holding, flight.holding = flight.holding, False
        if holding and not self._aborted.is_set():
            try:
                self._writes.release_hold(flight)
            except Exception:
                logger.exception("worker error while giving back the queue slot of %s",
                                 flight.claimed.job_name)

    def _free_slot(self) -> None:
        self._slots.give()
        self._wake.set()

    # The deadline thread ----------------------------------------------

    def time_out(self, flight: InFlight, error: str) -> bool:
        """Take the final write of a job past its deadline (a failure, retried) for the main loop.

        Returns whether it took it. Never blocks: if the job thread is
        writing its own outcome, that outcome stands.
        """
        if not flight.settled.acquire(blocking=False):
            return False
        with self._lock:
            taken = not flight.done and not self._closed
            if taken:
                flight.done = True
                self._timeouts.append((flight, Outcome(OutcomeKind.RETRY, error=error)))
        if not taken:
            flight.settled.release()
            return False
        flight.context._cancel().set()  # cooperative handlers stop
        self._wake.set()
        return True

    # The main loop ----------------------------------------------------

    def round(self, n: int) -> Answer:
        """Write the timeouts handed over, then the completions with a claim of ``n`` jobs."""
        self._write_timeouts()
        with self._lock:
            batch = self._completions[:MAX_CLAIM_BATCH]
            del self._completions[:MAX_CLAIM_BATCH]
        try:
            return self._writes.round(batch, n)
        finally:
            self._flights.finish_many(batch)

    def close(self) -> None:
        """The main loop is over: take no more timeouts; write those already handed over.

        After ``abort()`` none is written (a write could wait for a turn an abandoned
        call holds): their leases lapse, as every abandoned run's.
        """
        with self._lock:
            self._closed = True
        self._write_timeouts(write=not self._aborted.is_set())

    def _write_timeouts(self, write: bool = True) -> None:
        with self._lock:
            timeouts, self._timeouts = self._timeouts, []
        for flight, outcome in timeouts:
            try:  # its handler may run on: the failure holds the claim's queue slot
                if write:
                    self._writes.write_outcome(flight, outcome, hold=True)
            except Exception:
                logger.exception("%s %s: could not record its timeout", flight.claimed.job_name,
                                 flight.claimed.job_id)
            finally:
                flight.settled.release()  # taken by the deadline thread in time_out()


class InlineCompleter(Completer):
    """One slot: the job thread completes its job and claims the slot's next one, in one call.

    Nothing to batch with, so no hand-off: this spares two thread switches per job.
    """

    def _complete(self, flight: InFlight) -> InFlight | None:
        return self._round(flight, [flight])

    def _run_on(self, flight: InFlight) -> InFlight | None:
        return self._round(flight, [])  # an atomic job's completion is made: only the claim

    def _round(self, flight: InFlight, batch: list[InFlight]) -> InFlight | None:
        following = None
        try:
            answer = self._writes.round(batch, 0 if self._stopping.is_set() else 1)
            if answer.jobs:  # tracked before this one is forgotten: never idle between
                following = self._flights.track(answer.jobs[0], answer.traces)
        except Exception:
            logger.exception("worker error while running %s", flight.claimed.job_name)
        self._flights.finish(flight)
        if following is None:
            self._free_slot()
        return following


class BatchCompleter(Completer):
    """Several slots: completions go to the main loop, which writes them with its claims."""

    def hand_over(self, flight: InFlight, outcome: Outcome) -> bool:
        """``settle`` a completion without ever waiting (the event loop's thread calls it).

        False, nothing done: ``settle`` it on a job thread instead. So it is
        when its final write is taken or being taken (the deadline thread's
        timeout holds ``flight.settled`` until the main loop wrote it), or
        when the job is no longer this worker's (its write is a refusal to
        record, a database call), when progress it reported is not written yet
        (the job thread writes it first), or after ``abort()``.
        """
        progress = self._flights.progress
        if (outcome.kind is not OutcomeKind.DONE or self._aborted.is_set()
                or (progress is not None and progress.unwritten(flight.context))
                or not flight.settled.acquire(blocking=False)):
            return False
        try:
            if flight.done or flight.lost:
                return False
            flight.done = True
            flight.outcome = outcome
        finally:
            flight.settled.release()
        self._complete(flight)
        return True

    def _complete(self, flight: InFlight) -> None:
        # The slot first, then the completion: the round that writes the
        # completion also fills this slot (the loop reads pending writes first).
        # The main loop is woken once per round: by the first completion after
        # its last round took the pending ones; it takes those that follow too.
        self._slots.give()
        with self._lock:
            self._completions.append(flight)
            first = len(self._completions) == 1
        if first:
            self._wake.set()
        return None
