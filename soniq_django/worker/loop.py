"""The worker: claim → run → complete or fail, with fences from end to end.

Threads, each with its own database connection:

- the main thread, in rounds: one database call completes every job that
  finished since the last round (each against its own fence) and claims a
  job for every free slot (each with its own fresh nonce, kept before the
  call); it waits for a wake-up when there is nothing to do;
- ``concurrency`` job threads each run one handler; a completion is handed
  to the main thread, any other outcome is written by the job thread;
- the heartbeat thread renews every live lease, reads cancel requests,
  enforces timeouts and keeps the worker's own row fresh (heartbeat.py);
- on PostgreSQL a listener thread turns NOTIFY into wake-ups;
- optionally the scheduler.

The writes themselves -- rounds of completions and claims, single outcomes,
recovery after an unknown outcome -- are in writes.py. A final write that
returns False is logged and never retried by id; one that raises
QUEUE_PERSISTENCE_FAILED is recovered or retried with the same fence until
the database answers (or the lease is certainly gone).
"""

import logging
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from django.db import close_old_connections, connections

from ..conf import soniq_settings
from ..owned import OwnedJobSource
from ..owned_types import MAX_CLAIM_BATCH, ClaimedJob
from ..stats import ThroughputCounter
from . import registration
from .context import JobContext
from .execution import Outcome, OutcomeKind, execute
from .flight import InFlight
from .heartbeat import Heartbeats
from .wakeup import Listener
from .writes import UNKNOWN, JobWrites, keep_healthy_connections

logger = logging.getLogger("soniq_django.worker")


class Worker(JobWrites, Heartbeats):
    """One worker process's loop. ``run()`` returns when it stops."""

    def __init__(self, *, using: str = "default", queues: list[str] | None = None,
                 concurrency: int = 1, burst: bool = False, max_jobs: int | None = None,
                 worker_id: str | None = None, with_scheduler: bool = False,
                 grace_seconds: float = 30.0):
        self.using = using
        self.queues = queues
        self.concurrency = concurrency
        self.burst = burst
        self.max_jobs = max_jobs
        self.worker_id = worker_id or str(uuid.uuid4())
        self.with_scheduler = with_scheduler
        self.grace_seconds = grace_seconds
        self.source = OwnedJobSource(using)
        self.stopping = threading.Event()  # no more claims; finish in-flight jobs
        self.aborted = threading.Event()  # give up on in-flight jobs too
        self.wake = threading.Event()
        self.slots = threading.Semaphore(concurrency)
        self.inflight: dict[tuple[str, int], InFlight] = {}  # by claim: InFlight.key
        self.completions: list[InFlight] = []  # handed over by job threads, written in batches
        self.lock = threading.Lock()
        self.claimed_count = 0
        self.reserved = 0  # claims under way, counted against max_jobs until they answer
        self.finished = threading.Condition(self.lock)
        self.throughput = ThroughputCounter()
        self.pid = os.getpid()  # recorded with each claim
        self._unknown_streak = 0  # claims in a row whose outcome stayed unknown
        self._next_purge = 0.0

    # Control ----------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; in-flight jobs finish (up to the grace period)."""
        self.stopping.set()
        self.wake.set()

    def abort(self) -> None:
        """Stop now: in-flight jobs are abandoned and their leases will lapse."""
        self.aborted.set()
        self.request_stop()

    # Main loop --------------------------------------------------------

    def run(self) -> int:
        """Run until stopped (or, in burst mode, until nothing is left); return an exit code."""
        registration.register(self.using, self.worker_id, self.queues, self.concurrency)
        registration.publish_registry(self.using, self.worker_id)
        background = self._start_background()
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="soniq-job")
        logger.info("worker %s started (queues=%s, concurrency=%d)", self.worker_id,
                    ",".join(self.queues) if self.queues else "all", self.concurrency)
        try:
            self._dispatch_loop(pool)
        finally:
            pool.shutdown(wait=not self.aborted.is_set(), cancel_futures=True)
            self.stopping.set()
            for thread in background:
                thread.join(timeout=5)
            try:
                self.throughput.flush(self.using)
                registration.unregister(self.using, self.worker_id)
            except Exception:
                logger.warning("could not mark worker %s stopped", self.worker_id)
            close_old_connections()
        logger.info("worker %s stopped after %d jobs", self.worker_id, self.claimed_count)
        return 1 if self.aborted.is_set() else 0

    def _start_background(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._heartbeat_loop, name="soniq-heartbeat",
                                    daemon=True)]
        if connections[self.using].vendor == "postgresql":
            threads.append(Listener(self.using, self.queues, self.wake, self.stopping))
        if self.with_scheduler:
            from ..scheduler import Scheduler

            threads.append(threading.Thread(
                target=Scheduler(using=self.using).run_forever, args=(self.stopping,),
                name="soniq-scheduler", daemon=True))
        for thread in threads:
            thread.start()
        return threads

    def _dispatch_loop(self, pool: ThreadPoolExecutor) -> None:
        """Settle finished jobs and fill free slots, both in one transaction per round.

        Each round takes every completion the job threads handed over and
        every free slot, and makes one database call: complete them all (each
        against its own fence) and claim one job per free slot (each with its
        own nonce). It waits for a wake-up -- a job finished, a NOTIFY, the
        poll interval -- when there is nothing to do. After a stop (or once
        ``max_jobs`` is spoken for) it claims nothing more and settles the
        running jobs until none is left or the grace period is over.
        """
        claiming = True  # False after a claim found nothing, until the next wake-up
        drain_deadline = None
        while not self.aborted.is_set():
            with self.lock:
                batch = self.completions[:MAX_CLAIM_BATCH]
                del self.completions[:MAX_CLAIM_BATCH]
            winding_down = self.stopping.is_set() or self._max_jobs_reached()
            free = 0 if winding_down or not claiming else self._take_free_slots()
            wanted = self._reserve(free)
            self._release(free - wanted)
            if batch or wanted:
                claimed = self._settle_and_claim(batch, wanted)
                if claimed is UNKNOWN:  # the database keeps failing: don't hammer it
                    self._release(wanted)
                    self._unknown_streak += 1
                    self.aborted.wait(min(0.05 * 2 ** min(self._unknown_streak, 6), 2.0))
                    continue
                self._unknown_streak = 0
                self._release(wanted - len(claimed))
                for job in claimed:
                    pool.submit(self._run_job, self._track(job))
                if wanted and not claimed:
                    claiming = False  # the queue is empty: wait for news
                    if self.burst and self._idle():
                        return
                continue
            if winding_down:
                if self._idle():
                    return
                if drain_deadline is None:
                    drain_deadline = time.monotonic() + self.grace_seconds
                elif time.monotonic() >= drain_deadline:
                    logger.warning("grace period over; abandoning %d job(s)", len(self.inflight))
                    self.aborted.set()
                    return
                self._wait(0.5)
                continue
            if self.burst and not claiming and self._idle():
                return
            timeout = float(soniq_settings.POLL_INTERVAL) if not claiming else 0.5
            if self.burst:
                timeout = min(timeout, 0.2)
            self._wait(timeout)
            claiming = True

    def _wait(self, timeout: float) -> None:
        """Sleep until a wake-up (or ``timeout``); one that came while busy ends it at once."""
        self.wake.wait(timeout)
        self.wake.clear()

    def _max_jobs_reached(self) -> bool:
        return self.max_jobs is not None and self.claimed_count >= self.max_jobs

    def _take_free_slots(self) -> int:
        free = 0
        while free < self.concurrency and self.slots.acquire(blocking=False):
            free += 1
        return free

    def _reserve(self, wanted: int) -> int:
        """How many of ``wanted`` claims may be made without passing ``max_jobs``; reserves them."""
        with self.lock:
            if self.max_jobs is not None:
                wanted = max(0, min(wanted, self.max_jobs - self.claimed_count - self.reserved))
            self.reserved += wanted
            return wanted

    def _account(self, reserved: int, claimed: list) -> None:
        """A claim of ``reserved`` jobs answered with ``claimed``."""
        with self.lock:
            self.reserved -= reserved
            self.claimed_count += len(claimed)

    def _release(self, count: int) -> None:
        for _ in range(count):
            self.slots.release()

    def _track(self, claimed: ClaimedJob) -> InFlight:
        flight = InFlight(claimed, JobContext(
            job_id=str(claimed.job_id), job_name=claimed.job_name, queue=claimed.queue,
            attempts=claimed.attempts, max_attempts=claimed.max_attempts))
        with self.lock:
            self.inflight[flight.key] = flight
        return flight

    def _finish(self, flight: InFlight) -> None:
        """Forget this run -- only this one: another claim of the same job may be in flight."""
        with self.finished:
            if self.inflight.get(flight.key) is flight:
                del self.inflight[flight.key]
            self.finished.notify_all()

    def _idle(self) -> bool:
        with self.lock:
            return not self.inflight and not self.completions

    # One job ----------------------------------------------------------

    def _run_job(self, flight: InFlight | None) -> None:
        """Run the job; with one slot, also each next job its completion claimed."""
        while flight is not None:
            handed_over, following = False, None
            try:
                timeout = soniq_settings.JOB_TIMEOUT_SECONDS
                outcome = execute(flight.claimed, flight.context, timeout)
                if not self.aborted.is_set():
                    handed_over = self._settle(flight, outcome)
                if handed_over and self.concurrency == 1:
                    # Nothing to batch with: complete and claim from here,
                    # sparing two thread hand-offs per job.
                    handed_over = False
                    following = self._complete_here(flight)
            except Exception:
                logger.exception("worker error while running %s", flight.claimed.job_name)
            finally:
                if not handed_over:
                    self._finish(flight)
                keep_healthy_connections()
                if following is None:
                    # The slot first, then the completion: the main loop's next
                    # round writes the completion and fills this slot together.
                    self.slots.release()
                    if handed_over:
                        with self.lock:
                            self.completions.append(flight)
                    self.wake.set()
            flight = following

    def _complete_here(self, flight: InFlight) -> InFlight | None:
        """Write the completion and claim this slot's next job in one transaction."""
        wanted = 0 if self.stopping.is_set() else self._reserve(1)
        claimed = self._settle_and_claim([flight], wanted, finish=False)
        if not claimed or claimed is UNKNOWN:
            return None
        return self._track(claimed[0])  # tracked before this job is finished: never idle between

    def _settle(self, flight: InFlight, outcome: Outcome) -> bool:
        """Make the job's one final fenced write (unless the timeout already made it).

        A completion is left for the main loop, which writes it together with
        the next claim (returns True: the caller hands it over). Anything else
        is written here. The lock
        is held through the write: whichever of the job thread and the
        heartbeat (timeout) comes second waits until the first one's write is
        over, so a job is never seen finished while its outcome is still unwritten.
        """
        with flight.settled:
            if flight.done:
                return False
            flight.done = True
            if outcome.kind is OutcomeKind.DONE and not flight.lost:
                flight.outcome = outcome
                return True
            self._write_outcome(flight, outcome)
            return False

