"""The worker: claim → run → complete or fail, with fences from end to end.

Threads, each with its own database connection:

- the main thread, in rounds: one database call completes every job that
  finished since the last round (each against its own fence) and claims a
  job for every free slot (each with its own fresh nonce, kept before the
  call); it waits for a wake-up when there is nothing to do;
- ``concurrency`` job threads each run one handler; a completion is handed
  to the main thread, any other outcome is written by the job thread;
- the heartbeat thread renews every live lease, reads cancel requests,
  enforces timeouts and keeps the worker's own row fresh;
- on PostgreSQL a listener thread turns NOTIFY into wake-ups;
- optionally the scheduler.

A final write that returns False is logged and never retried by id; one
that raises QUEUE_PERSISTENCE_FAILED is retried with the same fence until
the database answers (or the lease is certainly gone).
"""

import logging
import os
import secrets
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.db import close_old_connections, connections

from ..conf import soniq_settings
from ..errors import ErrorCode, SoniqError
from ..owned import OwnedJobSource
from ..owned_store import guarded
from ..owned_types import MAX_CLAIM_BATCH, ClaimedJob
from ..registry import get_handler
from ..housekeeping import purge_expired
from ..models import Job
from ..stats import ThroughputCounter
from . import registration
from .context import JobContext
from .execution import Outcome, execute
from .wakeup import Listener

logger = logging.getLogger("soniq_django.worker")

#: How often a worker purges finished rows whose RESULT_TTL has passed.
HOUSEKEEPING_SECONDS = 60.0

# A round's answer when the database failed and recovery could not say whether
# the claim happened: not "nothing is eligible" (a burst worker must not exit).
_UNKNOWN = object()


@dataclass
class InFlight:
    """A job this worker is running."""

    claimed: ClaimedJob
    context: JobContext
    started: float = field(default_factory=time.monotonic)
    settled: threading.Lock = field(default_factory=threading.Lock)
    done: bool = False
    lost: bool = False
    outcome: Outcome | None = None  # a completion waiting for the main loop to write it


def _retrying(call, deadline: float, stop: threading.Event):
    """Call ``call()`` until it stops raising QUEUE_PERSISTENCE_FAILED or ``deadline`` passes.

    Returns its value, or None when the deadline passed without an answer.
    """
    delay = 0.05
    while True:
        try:
            return call()
        except SoniqError as error:
            if error.code is not ErrorCode.QUEUE_PERSISTENCE_FAILED:
                raise
        close_old_connections()
        if time.monotonic() >= deadline or stop.wait(delay):
            return None
        delay = min(delay * 2, 2.0)


class Worker:
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
        self.inflight: dict[str, InFlight] = {}
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
                if claimed is _UNKNOWN:  # the database keeps failing: don't hammer it
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
            self.inflight[flight.context.job_id] = flight
        return flight

    def _finish(self, flight: InFlight) -> None:
        with self.finished:
            self.inflight.pop(flight.context.job_id, None)
            self.finished.notify_all()

    def _idle(self) -> bool:
        with self.lock:
            return not self.inflight and not self.completions

    # One round's database call ---------------------------------------

    def _settle_and_claim(self, batch: list[InFlight], wanted: int, finish: bool = True):
        """Complete ``batch`` and claim ``wanted`` jobs in one call.

        Returns the claimed jobs, or _UNKNOWN when the database failed and
        recovery could not tell whether the claim happened. Every completion
        of the batch is settled (written, or known not to be) before it returns.
        """
        tokens = [secrets.token_hex(16) for _ in range(wanted)]  # kept before the call
        completions = [(flight.claimed.claim_fence, flight.outcome.result) for flight in batch]
        claimed: list = []
        try:
            if completions and tokens:
                completed, claimed = self.source.complete_many_and_claim_owned(
                    completions, claim_tokens=tokens, pid=self.pid, queues=self.queues)
            elif completions:
                completed = self.source.complete_many_owned(completions)
            else:
                completed = []
                claimed = self.source.claim_many_owned(
                    self.worker_id, claim_tokens=tokens, pid=self.pid, queues=self.queues)
        except SoniqError as error:
            if error.code is ErrorCode.QUEUE_PERSISTENCE_FAILED:
                completed, claimed = self._recover(completions, tokens)
            elif completions:  # the claim was refused: the completions must still be written
                logger.warning("claim refused (%s); completing without it", error.code.value)
                completed, claimed = self._complete_alone(completions), []
            else:
                raise
        finally:
            self._account(wanted, claimed if isinstance(claimed, list) else [])
        deadline = time.monotonic() + 3 * float(soniq_settings.LEASE_SECONDS)
        for flight, applied in zip(batch, completed):
            try:
                self._report(flight, flight.outcome, applied, deadline)
            except Exception:
                logger.exception("worker error while recording %s", flight.claimed.job_name)
            finally:
                if finish:
                    self._finish(flight)
        return claimed

    def _recover(self, completions, tokens):
        """After a call whose outcome is unknown: what was completed, and what was claimed.

        The call was one transaction that handed out its nonces in order, so
        a live claim under the first nonce proves everything committed; a
        completion is then found in the row itself. Otherwise each completion
        is sent again with its fence.
        """
        logger.warning("outcome unknown (database unavailable); recovering")
        deadline = time.monotonic() + 3 * float(soniq_settings.LEASE_SECONDS)
        claimed = []
        for token in tokens:
            job = _retrying(lambda token=token: self.source.recover_owned_claim(
                self.worker_id, claim_token=token), deadline, self.aborted)
            if job is None:
                break
            claimed.append(job)
        completed = [
            _retrying(lambda fence=fence, result=result: self._completed(fence)
                      or self.source.complete_owned(fence, result), deadline, self.aborted)
            for fence, result in completions
        ]
        if tokens and not claimed:
            return completed, _UNKNOWN  # nothing recovered proves nothing about the queue
        return completed, claimed

    def _complete_alone(self, completions) -> list[bool | None]:
        deadline = time.monotonic() + 3 * float(soniq_settings.LEASE_SECONDS)
        return [_retrying(lambda fence=fence, result=result: self.source.complete_owned(
            fence, result), deadline, self.aborted) for fence, result in completions]

    def _completed(self, fence) -> bool:
        """Whether this claim's completion is in the database (it was written unseen)."""
        with guarded(self.using, atomic=False):
            return Job.objects.using(self.using).filter(
                id=fence.job_id, status="done", claim_token=fence.claim_token,
                claim_generation=fence.generation,
            ).exists()

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
        if not claimed or claimed is _UNKNOWN:
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
            if outcome.kind == "done" and not flight.lost:
                flight.outcome = outcome
                return True
            self._write_outcome(flight, outcome)
            return False

    def _write_outcome(self, flight: InFlight, outcome: Outcome) -> None:
        claimed = flight.claimed
        if flight.lost:  # the heartbeat saw the claim go: it is not ours to write
            logger.warning("%s %s: %s not recorded; the lease was lost", claimed.job_name,
                           claimed.job_id, _verb(outcome))
            return
        fence = claimed.claim_fence
        handler = get_handler(claimed.job_name)
        default_max = handler.max_attempts if handler else soniq_settings.DEFAULT_MAX_ATTEMPTS
        if outcome.kind == "done":
            write = lambda: self.source.complete_owned(fence, outcome.result)  # noqa: E731
        elif outcome.kind == "retry":
            write = lambda: self.source.fail_owned(  # noqa: E731
                fence, outcome.error, retry=True, default_max_attempts=default_max)
        elif outcome.kind == "dead":
            write = lambda: self.source.fail_owned(  # noqa: E731
                fence, outcome.error, retry=False, dead_letter_reason=outcome.reason)
        else:
            write = lambda: self.source.acknowledge_cancel_owned(fence)  # noqa: E731
        deadline = time.monotonic() + 3 * float(soniq_settings.LEASE_SECONDS)
        self._report(flight, outcome, _retrying(write, deadline, self.aborted), deadline)

    def _report(self, flight: InFlight, outcome: Outcome, applied: bool | None,
                deadline: float) -> None:
        """Log and count a final write; honour a cancel that refused it."""
        claimed = flight.claimed
        fence = claimed.claim_fence
        elapsed = time.monotonic() - flight.started
        if applied:
            verb = _verb(outcome)
            handler = get_handler(claimed.job_name)
            default_max = handler.max_attempts if handler else soniq_settings.DEFAULT_MAX_ATTEMPTS
            limit = claimed.max_attempts if claimed.max_attempts is not None else default_max
            kind = {"done": "done", "retry": "failed", "dead": "dead_lettered",
                    "cancelled": "cancelled"}[outcome.kind]
            if outcome.kind == "retry" and claimed.attempts >= limit:
                verb = "failed with no attempts left, dead-lettered"
                kind = "dead_lettered"
            self.throughput.add(claimed.queue, kind)
            logger.info("%s %s %s after %.3fs (attempt %s)", claimed.job_name, claimed.job_id,
                        verb, elapsed, claimed.attempts)
            return
        if outcome.kind != "cancelled" and self._cancel_pending(fence):
            # A cancel arrived while the handler was finishing: honour it.
            if _retrying(lambda: self.source.acknowledge_cancel_owned(fence), deadline,
                         self.aborted):
                logger.info("%s %s cancelled after %.3fs", claimed.job_name, claimed.job_id,
                            elapsed)
                return
        logger.warning("%s %s: %s not recorded; the job is no longer this worker's "
                       "(lease lost, cancelled or re-claimed)", claimed.job_name,
                       claimed.job_id, _verb(outcome))

    def _cancel_pending(self, fence) -> bool:
        try:
            state = self.source.get_owned_state(fence)
        except SoniqError:
            return False
        return state is not None and state.cancel_requested

    # Heartbeats -------------------------------------------------------

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

    def _beat(self, flight: InFlight) -> None:
        if flight.done or flight.lost:
            return
        fence = flight.claimed.claim_fence
        timeout = soniq_settings.JOB_TIMEOUT_SECONDS
        try:
            if timeout is not None and time.monotonic() - flight.started > float(timeout):
                flight.context._cancel.set()  # cooperative handlers stop
                self._settle(flight, Outcome("retry", error=f"timed out after {timeout} s"))
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


def keep_healthy_connections() -> None:
    """Between jobs: close broken connections, keep healthy ones open.

    ``close_old_connections()`` treats each job like a web request: with the
    default ``CONN_MAX_AGE=0`` it closes every connection, and the next
    fenced write pays for a new backend and a cold PL/pgSQL session (about
    9 ms a job, measured in bench/). A worker is one long "request", so it
    keeps healthy connections; a positive ``CONN_MAX_AGE`` still recycles
    them, and a connection that failed is closed and reopened on next use.
    """
    for conn in connections.all(initialized_only=True):
        if conn.connection is None:
            continue
        max_age = conn.settings_dict["CONN_MAX_AGE"]
        if (
            conn.get_autocommit() != conn.settings_dict["AUTOCOMMIT"]
            or (conn.errors_occurred and not conn.is_usable())
            or (max_age and conn.close_at is not None and time.monotonic() >= conn.close_at)
        ):
            conn.close()
        else:
            conn.errors_occurred = False


def _verb(outcome: Outcome) -> str:
    return {"done": "done", "retry": "failed, will retry", "dead": "dead-lettered",
            "cancelled": "cancelled"}[outcome.kind]
