"""A worker's heartbeat: leases, cancel requests, timeouts, its own row, housekeeping.

It never makes a final write: a job past its timeout is handed to the
completer (``time_out``), whose main loop writes the failure.
"""

import logging
import threading
import time
from collections.abc import Callable

from django.db import close_old_connections

from ..conf import get_settings
from ..errors import ErrorCode, SoniqError
from ..housekeeping import purge_expired
from ..owned import OwnedJobSource
from ..throughput import ThroughputCounter
from . import registration
from .flight import Flights, InFlight
from .writes import keep_healthy_connections

logger = logging.getLogger("soniq_django.worker")

#: How often a worker purges finished rows whose RESULT_TTL has passed.
HOUSEKEEPING_SECONDS = 60.0


def beat_interval() -> float:
    """Seconds between heartbeats: HEARTBEAT_SECONDS, at most a third of the lease."""
    lease = float(get_settings().LEASE_SECONDS)
    return max(0.05, min(float(get_settings().HEARTBEAT_SECONDS), lease / 3))


class Heartbeat:
    """``run()`` is the heartbeat thread: every ``beat_interval()`` until stopped and idle."""

    def __init__(self, *, source: OwnedJobSource, worker_id: str, flights: Flights,
                 throughput: ThroughputCounter, time_out: Callable[[InFlight, object], None],
                 stopping: threading.Event, aborted: threading.Event):
        self.source = source
        self.using = source.using
        self.worker_id = worker_id
        self.flights = flights
        self.throughput = throughput
        self.time_out = time_out
        self.stopping = stopping
        self.aborted = aborted
        self._next_purge = 0.0

    def run(self) -> None:
        while not self.stopping.wait(beat_interval()) or len(self.flights):
            if self.aborted.is_set():
                return
            self.beat_worker()
            for flight in self.flights.all():
                try:
                    self.beat(flight)
                except Exception:  # one job's trouble must not stop every lease's renewal
                    logger.exception("heartbeat of %s %s failed", flight.claimed.job_name,
                                     flight.claimed.job_id)
                    close_old_connections()
            keep_healthy_connections()
            if self.stopping.is_set():
                time.sleep(beat_interval())

    def beat_worker(self) -> None:
        """The worker's own row, its throughput counts, and housekeeping."""
        try:
            registration.beat(self.using, self.worker_id,
                              "stopping" if self.stopping.is_set() else "running")
            self.throughput.flush(self.using)
            self.housekeep()
        except Exception:
            close_old_connections()

    def housekeep(self) -> None:
        """Purge expired finished rows about once a minute (never protected ones)."""
        now = time.monotonic()
        if now < self._next_purge:
            return
        self._next_purge = now + HOUSEKEEPING_SECONDS
        purged = purge_expired(self.using)
        if purged:
            logger.info("housekeeping: purged %d expired job rows", purged)

    def beat(self, flight: InFlight) -> None:
        """Renew one job's lease and read its cancel request -- or hand over its timeout."""
        if flight.done or flight.lost:
            return
        timeout = get_settings().JOB_TIMEOUT_SECONDS
        if timeout is not None and time.monotonic() - flight.started > float(timeout):
            self.time_out(flight, timeout)
            return
        fence = flight.claimed.claim_fence
        try:
            if not self.source.heartbeat_owned(fence):
                if flight.done:  # its final write ended the claim meanwhile: not a loss
                    return
                flight.lost = True
                flight.context._cancel.set()
                logger.warning("%s %s: lease lost; this worker will not write it again",
                               flight.claimed.job_name, flight.claimed.job_id)
                return
            state = self.source.get_owned_state(fence)
            if state is not None and state.cancel_requested:
                flight.context._cancel.set()
        except SoniqError as error:
            if error.code is not ErrorCode.QUEUE_PERSISTENCE_FAILED:
                raise
            logger.warning("heartbeat failed (database unavailable); retrying")
            close_old_connections()
