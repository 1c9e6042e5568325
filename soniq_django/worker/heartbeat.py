"""A worker's heartbeat thread: leases, cancel requests, timeouts, its own row, housekeeping.

``Heartbeats`` is a part of ``Worker`` (worker/loop.py).
"""

import logging
import threading
import time

from django.db import close_old_connections, connections

from ..conf import soniq_settings
from ..errors import ErrorCode, SoniqError
from ..housekeeping import purge_expired
from . import registration
from .execution import Outcome, OutcomeKind
from .flight import InFlight
from .writes import keep_healthy_connections

logger = logging.getLogger("soniq_django.worker")

#: How often a worker purges finished rows whose RESULT_TTL has passed.
HOUSEKEEPING_SECONDS = 60.0


class Heartbeats:
    """The heartbeat thread of ``Worker``."""

    def _heartbeat_loop(self) -> None:
        while not self.stopping.wait(self._beat_interval()) or self._busy():
            if self.aborted.is_set():
                return
            try:
                registration.beat(self.using, self.worker_id,
                                  "stopping" if self.stopping.is_set() else "running")
                self.throughput.flush(self.using)
                self._housekeeping()
            except Exception:
                close_old_connections()
            with self.lock:
                flights = list(self.inflight.values())
            for flight in flights:
                try:
                    self._beat(flight)
                except Exception:  # one job's trouble must not stop every lease's renewal
                    logger.exception("heartbeat of %s %s failed", flight.claimed.job_name,
                                     flight.claimed.job_id)
                    close_old_connections()
            keep_healthy_connections()
            if self.stopping.is_set():
                time.sleep(self._beat_interval())

    def _housekeeping(self) -> None:
        """Purge expired finished rows about once a minute (never protected ones)."""
        now = time.monotonic()
        if now < self._next_purge:
            return
        self._next_purge = now + HOUSEKEEPING_SECONDS
        purged = purge_expired(self.using)
        if purged:
            logger.info("housekeeping: purged %d expired job rows", purged)

    def _busy(self) -> bool:
        with self.lock:
            return bool(self.inflight)

    @staticmethod
    def _beat_interval() -> float:
        lease = float(soniq_settings.LEASE_SECONDS)
        return max(0.05, min(float(soniq_settings.HEARTBEAT_SECONDS), lease / 3))

    def _time_out(self, flight: InFlight, timeout) -> None:
        """Fail a job that ran past JOB_TIMEOUT_SECONDS (with retry), on its own thread.

        Called holding ``flight.settled`` (taken by the heartbeat); releases it
        once the write is over.
        """
        try:
            self._write_outcome(flight, Outcome(OutcomeKind.RETRY,
                                                error=f"timed out after {timeout} s"))
        except Exception:
            logger.exception("%s %s: could not record its timeout", flight.claimed.job_name,
                             flight.claimed.job_id)
        finally:
            try:
                connections.close_all()  # this thread's own connection
            finally:
                flight.settled.release()

    def _beat(self, flight: InFlight) -> None:
        if flight.done or flight.lost:
            return
        fence = flight.claimed.claim_fence
        timeout = soniq_settings.JOB_TIMEOUT_SECONDS
        try:
            if timeout is not None and time.monotonic() - flight.started > float(timeout):
                # Take the job's one final write now (the job thread, finishing
                # meanwhile, waits on the lock and then finds it done) and make
                # it on a thread of its own: a write that has to wait for the
                # database must not hold up every other lease's renewal.
                if not flight.settled.acquire(blocking=False):
                    return  # the job thread is writing its own outcome
                if flight.done:
                    flight.settled.release()
                    return
                flight.done = True
                flight.context._cancel.set()  # cooperative handlers stop
                threading.Thread(target=self._time_out, args=(flight, timeout),
                                 name="soniq-timeout", daemon=True).start()
                return
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
