"""A worker's heartbeat: leases, holds, cancel requests, its own row, housekeeping.

It never makes a final write. Timeouts are not its business: the deadline
thread (deadlines.py) times a job out when its limit is up, and a
timed-out job's lease is not renewed (its final write is taken).

Each step of a beat (the worker's row; each job's lease) is one turn on
the worker's shared connection (connection.py), so the other threads'
calls go in between. A slow call of another thread must not hold up the
lease renewals: the heartbeat waits at most half a beat for its turn, and
otherwise makes the step on a connection of its own, which it closes
after the first beat that had the shared one again -- unless the shared connection is waiting for a
server that refuses connections: then no second one would be had either,
and the beat is skipped.
"""

import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from django.db import connections

from .. import signals
from ..conf import get_settings
from ..errors import ErrorCode, SoniqError
from ..housekeeping import purge_expired
from ..owned import OwnedJobSource
from ..owned._store import LOCK_NOT_AVAILABLE
from ..owned.types import MAX_CLAIM_BATCH
from ..throughput import ThroughputCounter
from . import registration
from .connection import SharedConnection, keep_healthy
from .flight import Flights, InFlight

logger = logging.getLogger("soniq_django.worker")

#: How often a worker purges finished rows whose RESULT_TTL has passed.
HOUSEKEEPING_SECONDS = 60.0
#: Rows purged in one batch (one short transaction, in a turn of its own on the
#: shared connection). A purge goes on while batches come back full, for at most
#: half a beat (then again at the next beat): docs/decisions/0020-storage-tuning.md.
PURGE_BATCH = 1000


def beat_interval() -> float:
    """Seconds between heartbeats: HEARTBEAT_SECONDS, at most a third of the lease."""
    lease = float(get_settings().LEASE_SECONDS)
    return max(0.05, min(float(get_settings().HEARTBEAT_SECONDS), lease / 3))


class Heartbeat:
    """``run()`` is the heartbeat thread: every ``beat_interval()`` until stopped and idle."""

    def __init__(self, *, source: OwnedJobSource, shared: SharedConnection, worker_id: str,
                 flights: Flights, throughput: ThroughputCounter, stopping: threading.Event,
                 aborted: threading.Event):
        self.source = source
        self.shared = shared
        self.using = source.using
        self.worker_id = worker_id
        self.flights = flights
        self.throughput = throughput
        self.stopping = stopping
        self.aborted = aborted
        self._next_purge = 0.0
        self._aside = False  # the last beat went on a connection of its own (a slow call held ours)

    def run(self) -> None:
        try:
            while not self.stopping.wait(beat_interval()) or len(self.flights):
                if self.aborted.is_set():
                    return
                self.beat_all()
                if self.stopping.is_set():
                    # Draining: beat again in a beat, or end as soon as the last job's
                    # write is over (the worker's exit waits for this thread).
                    self.flights.wait_empty(beat_interval())
        finally:
            connections.close_all()  # this thread's own, if the last beats went aside

    def beat_all(self) -> None:
        """One beat: the worker's row, then every lease; each step in a turn of its own.

        While an atomic job of this worker holds SQLite's write lock, every
        write would only wait for it: the beat is skipped.
        """
        flights = self.flights.all()
        if any(flight.holds_write_lock for flight in flights):
            return
        aside = False
        try:
            steps: list[Callable[[], object]] = [
                self.beat_worker, *(partial(self._beat_one, flight) for flight in flights),
                self.renew_holds]
            for step in steps:
                with self.shared.try_turn(beat_interval() / 2) as turn:
                    if not turn and self.shared.connecting:
                        return  # no connection to be had; the waiting turn said so
                    aside = aside or not turn
                    step()
            self._housekeep_quietly()
            logger.debug("heartbeat: worker row and %d running job(s)%s", len(self.flights),
                         " (on a second connection)" if aside else "")
        except SoniqError:
            return  # stopping, and the server refused the connection
        finally:
            self._aside_for(aside)

    def _aside_for(self, aside: bool) -> None:
        """Say once that beats went aside; close the second connection once they are back."""
        if aside and not self._aside:
            logger.warning("a slow database call holds the worker's connection; renewing "
                           "leases on a second connection meanwhile")
        for conn in connections.all(initialized_only=True):  # this thread's own
            if aside:
                keep_healthy(conn)
            else:
                conn.close()
        self._aside = aside

    def _beat_one(self, flight: InFlight) -> None:
        try:
            self.beat(flight)
        except Exception:  # one job's trouble must not stop every lease's renewal
            logger.exception("heartbeat of %s %s failed", flight.claimed.job_name,
                             flight.claimed.job_id)

    def beat_worker(self) -> None:
        """The worker's own row and its throughput counts."""
        try:
            state = "stopping" if self.stopping.is_set() else "running"
            registration.beat(self.using, self.worker_id, state)
            signals.heartbeat(self.worker_id, using=self.using, state=state,
                              in_flight=len(self.flights))
            self.throughput.flush(self.using)
        except Exception:  # the next beat tries again (the turn closed a broken connection)
            pass

    def renew_holds(self) -> None:
        """Renew the holds of the queue slots of timed-out handlers still running (one call).

        None held (the usual case): no call. A hold that was not renewed had
        lapsed (the worker could not renew it for a lease): its slot is free
        for other claims while the handler still runs, and the log says so.
        """
        held = [flight for flight in self.flights.all() if flight.holding]
        if not held:
            return
        try:
            for start in range(0, len(held), MAX_CLAIM_BATCH):
                batch = held[start:start + MAX_CLAIM_BATCH]
                renewed = self.source._renew_holds(
                    self.worker_id, [flight.claimed.claim_fence for flight in batch])
                if renewed < len(batch):
                    logger.warning("%d timed-out handler(s) still running no longer hold their "
                                   "queue's slot (the hold lapsed before it was renewed)",
                                   len(batch) - renewed)
        except Exception:  # the next beat tries again (the turn closed a broken connection)
            logger.warning("could not renew the queue slots held by timed-out handlers; "
                           "retrying at the next beat")

    def _housekeep_quietly(self) -> None:
        try:
            self.housekeep()
        except Exception:  # the next beat tries again (the turn closed a broken connection)
            pass

    def housekeep(self) -> None:
        """Purge expired finished rows (never protected ones), about once a minute.

        Batch after batch while they come back full, each in a turn of its
        own on the shared connection, so the job threads' calls go in
        between; for at most half a beat, and if the last batch was still
        full, on at the next beat rather than a minute later. So a worker
        deletes as fast as its jobs finish (up to what half its heartbeat
        thread's time allows), not one batch per beat: that was 100 rows a
        second per worker, and a faster drain grew the table without bound.
        """
        now = time.monotonic()
        if now < self._next_purge:
            return
        self._next_purge = now + HOUSEKEEPING_SECONDS
        deadline = now + beat_interval() / 2
        total = 0
        while True:
            with self.shared.try_turn(beat_interval() / 2) as turn:
                if not turn:
                    self._next_purge = now  # the connection is busy: at the next beat
                    break
                purged = purge_expired(self.using, batch=PURGE_BATCH, batches=1)
            total += purged
            if purged < PURGE_BATCH:
                break
            if time.monotonic() >= deadline:
                self._next_purge = now
                break
        if total:
            logger.info("housekeeping: purged %d expired job rows", total)

    def beat(self, flight: InFlight) -> None:
        """Renew one job's lease and read its cancel request (none once its write is taken)."""
        if flight.done or flight.lost:
            return
        fence = flight.claimed.claim_fence
        try:
            # Half a beat at most for another transaction's lock on the row: the
            # other jobs' leases are renewed in the same beat, after this one.
            if not self.source.heartbeat_owned(fence, lock_wait=beat_interval() / 2):
                if flight.done:  # its final write ended the claim meanwhile: not a loss
                    return
                flight.lost = True
                flight.context._cancel().set()
                signals.lost(flight, worker_id=self.worker_id, using=self.using)
                logger.warning("%s %s: lease lost; this worker will not write it again",
                               flight.claimed.job_name, flight.claimed.job_id)
                return
            if flight.row_locked:
                flight.row_locked = False
                logger.info("%s %s: its row is free again; its lease is renewed",
                            flight.claimed.job_name, flight.claimed.job_id)
            state = self.source.get_owned_state(fence)
            if state is not None and state.cancel_requested:
                flight.context._cancel().set()
        except SoniqError as error:
            if error.code is not ErrorCode.QUEUE_PERSISTENCE_FAILED:
                raise
            if error.reason != LOCK_NOT_AVAILABLE:
                logger.warning("heartbeat failed (database unavailable); retrying")
            elif not flight.row_locked:  # once while it lasts; the next beats try again
                flight.row_locked = True
                logger.warning("%s %s: its row is locked by another transaction; its lease is "
                               "not renewed until the lock is released (it lapses if the lock "
                               "outlasts it)", flight.claimed.job_name, flight.claimed.job_id)
