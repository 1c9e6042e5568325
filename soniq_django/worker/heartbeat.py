"""A worker's heartbeat: leases, holds, cancel requests, its own row, housekeeping.

It never makes a final write. It renews the lease of every claim this
worker holds until that claim's final write is made -- also while the
write waits: a completion handed to the main loop's next round, a
timeout's failure handed over by the deadline thread, a failure retried
on a job thread. Only an atomic run's completion, written in its own
transaction and waiting for its COMMIT, is left alone (that transaction
holds the row).

One beat is one turn on the worker's shared connection (connection.py),
waited for at most ``patience()`` (half a beat) once per beat: the
renewal of every lease and the reading of their cancel requests in one
call (``heartbeat_many_owned``), then the worker's row. If another
thread's call holds the connection longer (a claim waiting on a lock, a
slow server), the whole beat goes on a connection of the heartbeat's own,
which it closes after the first beat that had the shared one again --
unless the shared connection is waiting for a server that refuses
connections: then no second one would be had either, and the beat is
skipped. A renewal never waits behind a claim, and a beat's renewals are
sent within one beat of its start (bounds.py).
"""

import datetime as dt
import logging
import math
import threading
import time

from django.db import connections

from .. import signals
from ..bounds import beat_interval, lock_wait, patience, renewal_wait
from ..conf import get_settings
from ..errors import ErrorCode, SoniqError
from ..housekeeping import database_now, forget_lapsed_waiters, purge_expired, settle_lapsed
from ..keys.limits import sweep_lapsed_holds
from ..owned import OwnedJobSource, OwnedJobState
from ..owned._store import LOCK_NOT_AVAILABLE
from ..owned.types import MAX_CLAIM_BATCH
from ..throughput import ThroughputCounter
from . import registration
from .connection import SharedConnection, keep_healthy
from .flight import Flights, InFlight
from .rebuilds import Rebuilds

logger = logging.getLogger("soniq_django.worker")

#: How often a worker purges finished rows whose RESULT_TTL has passed.
HOUSEKEEPING_SECONDS = 60.0
#: Rows purged in one batch (one short transaction, in a turn of its own on the
#: shared connection). A purge goes on while batches come back full, for at most
#: half a beat (then again at the next beat): docs/decisions/0020-storage-tuning.md.
PURGE_BATCH = 1000

#: The purge reads the rows that expired since its last complete run, less this (seconds of
#: database time): a row finished later than that, or committed that late, waits for the
#: next purge from the start (decision 0035).
PURGE_MARGIN_SECONDS = 60.0
#: How often the purge reads from the start all the same.
FULL_PURGE_SECONDS = 600.0

#: The shortest lock wait of a renewal made one by one, after the beat's own time is spent.
MIN_RENEWAL_WAIT = 0.01

__all__ = ["Heartbeat", "beat_interval"]


class Heartbeat:
    """``run()`` is the heartbeat thread: every ``beat_interval()`` until stopped and idle."""

    def __init__(self, *, source: OwnedJobSource, shared: SharedConnection, worker_id: str,
                 flights: Flights, throughput: ThroughputCounter, stopping: threading.Event,
                 aborted: threading.Event, queues: list[str] | None = None,
                 concurrency: int = 1):
        self.source = source
        self.queues = queues  # what the worker registered: a re-registration says it again
        self.concurrency = concurrency
        self.shared = shared
        self.using = source.using
        self.worker_id = worker_id
        self.flights = flights
        self.throughput = throughput
        self.stopping = stopping
        self.aborted = aborted
        self._next_purge = 0.0
        self._purge_after: dt.datetime | None = None  # database time: see housekeep()
        self._next_full_purge = 0.0
        self.rebuilds = Rebuilds(shared, source.using)
        self._aside = False  # the last beat went on a connection of its own (a slow call held ours)

    def run(self) -> None:
        try:
            wait = beat_interval()
            while not self.stopping.wait(wait) or len(self.flights):
                if self.aborted.is_set():
                    return
                started = time.monotonic()
                self.beat_all()
                if self.stopping.is_set():
                    # Draining: beat again in a beat, or end as soon as the last job's
                    # write is over (the worker's exit waits for this thread).
                    self.flights.wait_empty(beat_interval())
                # Beats start a beat apart, however long the last one took (at once when
                # it took longer): a slow beat does not push the next renewals back.
                wait = max(0.0, started + beat_interval() - time.monotonic())
        finally:
            connections.close_all()  # this thread's own, if the last beats went aside

    def beat_all(self) -> None:
        """One beat: every lease, then the worker's row, in one turn; then housekeeping.

        The turn is waited for at most ``patience()``; then the beat goes on
        the heartbeat's own connection. While an atomic job of this worker
        holds SQLite's write lock, every write would only wait for it: the
        beat is skipped.
        """
        flights = [flight for flight in self.flights.all()
                   if not flight.lost and not flight.commit_pending]
        if any(flight.holds_write_lock for flight in self.flights.all()):
            return
        deadline = time.monotonic() + beat_interval()  # the renewals are sent by then
        aside = False
        try:
            with self.shared.try_turn(patience()) as turn:  # one patience per beat
                if not turn and self.shared.connecting:
                    return  # no connection to be had; the waiting turn said so
                aside = not turn
                self._renew_quietly(flights, deadline)
                self.beat_worker()
                self.renew_holds()
            self._housekeep_quietly(deadline)
            logger.debug("heartbeat: worker row and %d running job(s)%s", len(flights),
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

    def _renew_quietly(self, flights: list[InFlight], deadline: float) -> None:
        try:
            self.renew(flights, deadline)
        except Exception:  # the next beat tries again (the turn closed a broken connection)
            logger.exception("heartbeat: renewing the leases failed")

    def beat_worker(self) -> None:
        """The worker's own row and its throughput counts."""
        try:
            state = "stopping" if self.stopping.is_set() else "running"
            if not registration.beat(self.using, self.worker_id, state) and state == "running":
                # No row, or one marked stopped (replaced by another worker of
                # this host and pid): register again, or peers take it for gone.
                logger.warning("worker %s: its row was gone or stopped; registering again",
                               self.worker_id[:8])
                registration.register(self.using, self.worker_id, self.queues, self.concurrency)
                registration.publish_registry(self.using, self.worker_id)
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

    def _housekeep_quietly(self, deadline: float) -> None:
        try:
            self.housekeep(deadline)
        except Exception:  # the next beat tries again (the turn closed a broken connection)
            pass

    def housekeep(self, deadline: float | None = None) -> None:
        """Purge expired finished rows (never protected ones), about once a minute.

        Batch after batch while they come back full, each in a turn of its
        own on the shared connection, so the job threads' calls go in
        between; for at most half a beat, and no later than ``deadline``
        (the end of the beat's own time: the next beat's renewals are not
        pushed back); if the last batch was still full, on at the next beat
        rather than a minute later. So a worker deletes as fast as its jobs
        finish (up to what half its heartbeat thread's time allows), not one
        batch per beat: that was 100 rows a second per worker, and a faster
        drain grew the table without bound.

        It reads only the rows that expired since its last complete purge
        (less PURGE_MARGIN_SECONDS), and from the start every
        FULL_PURGE_SECONDS: under an old snapshot (a pinned horizon) the rows
        it deleted stay in the ``expires_at`` index, and a purge from the
        start would read them all again, batch after batch, holding the
        shared connection (decision 0035).
        """
        now = time.monotonic()
        if now < self._next_purge:
            return
        self._next_purge = now + HOUSEKEEPING_SECONDS
        deadline = min(now + beat_interval() / 2, deadline or math.inf)
        after = self._purge_after
        if now >= self._next_full_purge:
            after = None
        started: dt.datetime | None = None
        total = 0
        while True:
            with self.shared.try_turn(max(0.0, deadline - time.monotonic())) as turn:
                if not turn:
                    self._next_purge = now  # the connection is busy: at the next beat
                    break
                if started is None:
                    started = database_now(self.using)
                purged = purge_expired(self.using, batch=PURGE_BATCH, batches=1, after=after)
            total += purged
            if purged < PURGE_BATCH:  # complete: the next one starts near here
                self._purge_after = started - dt.timedelta(seconds=PURGE_MARGIN_SECONDS)
                if after is None:
                    self._next_full_purge = now + FULL_PURGE_SECONDS
                break
            if time.monotonic() >= deadline:
                self._next_purge = now
                break
        if total:
            logger.info("housekeeping: purged %d expired job rows", total)
        if after is None:  # with each full purge: the rows of waiters that died (waiting.py)
            with self.shared.try_turn(max(0.0, deadline - time.monotonic())) as turn:
                if turn:
                    try:
                        forget_lapsed_waiters(self.using)
                    except SoniqError:
                        logger.debug("housekeeping: could not delete lapsed waiters' rows")
        # Lapsed leases, read from the start: under a pinned horizon the claims do it only
        # every 300 s, this once a minute (claim protocol v14, decision 0053).
        with self.shared.try_turn(max(0.0, deadline - time.monotonic())) as turn:
            if turn:
                try:
                    settled = settle_lapsed(self.using, float(get_settings().RESULT_TTL),
                                           lock_wait())
                except SoniqError:
                    settled = 0
                    logger.debug("housekeeping: could not settle lapsed leases")
                if settled:
                    logger.info("housekeeping: settled %d lapsed leases", settled)
        # The lapsed holds that keep a key's slot (limits per key, docs/keys.md).
        with self.shared.try_turn(max(0.0, deadline - time.monotonic())) as turn:
            if turn:
                try:
                    swept = sweep_lapsed_holds(self.using, lock_wait())
                except SoniqError:
                    swept = 0
                    logger.debug("housekeeping: could not sweep lapsed key holds")
                if swept:
                    logger.info("housekeeping: gave back %d key slots of lapsed holds", swept)
        # After a pinned horizon: rebuild the indexes it left bloated (decision 0037).
        self.rebuilds.look(max(0.0, deadline - time.monotonic()))

    def renew(self, flights: list[InFlight], deadline: float) -> None:
        """Renew every lease and read every cancel request: in one call, else one by one.

        The call lasts until ``deadline`` at most (``renewal_wait()`` if
        that is sooner): its statement is bounded by that, each row lock by
        half of it. A row another transaction holds (the last beat found it
        so, or this call waited past its bound) is renewed on its own, each
        in a share of what is left of the beat's time (at least
        ``MIN_RENEWAL_WAIT``), so the others are renewed at once.
        """
        batch = [flight for flight in flights if not flight.row_locked]
        alone = [flight for flight in flights if flight.row_locked]
        if batch:
            budget = min(renewal_wait(), deadline - time.monotonic())
            wait = max(MIN_RENEWAL_WAIT, budget / 2)  # its statement: twice that (bounds_sql)
            try:
                states = self.source.heartbeat_many_owned(
                    [flight.claimed.claim_fence for flight in batch], lock_wait=wait)
            except SoniqError as error:
                if error.code is not ErrorCode.QUEUE_PERSISTENCE_FAILED:
                    raise
                if error.reason != LOCK_NOT_AVAILABLE:
                    logger.warning("heartbeat failed (database unavailable); retrying")
                    return
                if connections[self.using].vendor == "sqlite":
                    # The busy timeout passed: another writer holds the database's one lock.
                    logger.warning("heartbeat: the database is locked by another writer; the "
                                   "leases are renewed at the next beat")
                    return
                alone = batch + alone  # a row is held: find which, renewing the others
            else:
                for flight, state in zip(batch, states):
                    self._renewed(flight, state)
        for flight in alone:
            share = (deadline - time.monotonic()) / len(alone)
            try:
                self.beat(flight, max(MIN_RENEWAL_WAIT, share / 2))
            except Exception:  # one job's trouble must not stop every lease's renewal
                logger.exception("heartbeat of %s %s failed", flight.claimed.job_name,
                                 flight.claimed.job_id)

    def beat(self, flight: InFlight, lock_wait: float | None = None) -> None:
        """Renew one job's lease and read its cancel request."""
        fence = flight.claimed.claim_fence
        try:
            state = self.source.heartbeat_many_owned(
                [fence], lock_wait=lock_wait or renewal_wait() / 2)[0]
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
            return
        self._renewed(flight, state)

    def _renewed(self, flight: InFlight, state: OwnedJobState | None) -> None:
        """What a renewal answered: the lease renewed (``state``), or the claim gone (None)."""
        if state is None:
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
        if state.cancel_requested:
            flight.context._cancel().set()
