"""The worker: claim → run → complete or fail, with fences from end to end, built from parts.

Threads, and what each one writes:

- the **main thread** runs the loop: it takes a snapshot, asks the planner
  (planner.py) what to do -- claim n, wait t, stop -- and does it. A claim
  is a round of the completer (completer.py): one database call that
  writes the completions handed over and claims a job for each free slot,
  each with its own fresh nonce kept before the call. The main thread also
  writes the timeouts the deadline thread handed over.
- ``concurrency`` **job threads** each run one handler at a time
  (execution.py, no database) and settle it through the completer: a
  failure, a dead letter or a cancel acknowledgement is written by the job
  thread. A completion, with one slot, is written by the job thread in one
  transaction with the claim of the slot's next job, which it then runs
  (``InlineCompleter``); with more slots it is handed to the main thread's
  next round (``BatchCompleter``). An atomic job's completion is written by
  its job thread, on that thread's own connection, in the handler's
  transaction (atomic.py).
- ``async def`` handlers run as tasks on the worker's **one event loop**
  (eventloop.py): above one slot on its own thread, to which the main loop
  hands a round's async jobs at once; a completion is handed over there
  (no database call), any other final write goes to a job thread. With
  one slot the job thread runs the loop itself.
- the **heartbeat thread** (heartbeat.py) renews every lease, reads cancel
  requests, refreshes the worker's row and throughput counts, and purges
  expired rows.
- the **deadline thread** (deadlines.py) times each job out when its limit
  is up (``@job(timeout=...)``, else ``JOB_TIMEOUT_SECONDS``): it takes the
  job's final write and hands it to the main thread, but writes none.
- on PostgreSQL a **listener thread** (wakeup.py) turns NOTIFY into
  wake-ups; optionally the **scheduler** thread enqueues periodic jobs.

So every final write has one owner:

- a completion: with one slot, the job thread (with the next claim, in one
  transaction); with more, the main thread (with the round's claims); an
  atomic job's, its job thread (in the handler's transaction);
- a failure, a dead letter, a deferral, a cancel acknowledgement: the job thread;
- the failure of a job past its time limit: the main thread, at once, with
  a hold of its queue slot while the handler runs on (released by the job
  thread when it returns, renewed by the heartbeat meanwhile);
- a cancel honoured after it refused a write: the thread of that write.

Every claim goes through ``Writes.round`` (writes.py), from whichever thread.

Stopping (decision 0032): after a stop signal the running jobs get the
grace period; then each is asked to stop (``StopRuns``: its context's stop
request, which a cooperative handler sees as a cancel), and a run that ends
is given back by its job thread (``defer_owned``, no attempt spent). Runs
still going ``planner.WIND_UP`` seconds later are abandoned; the worker's
threads are joined within ``JOIN_SECONDS``, its row is marked stopped within
``SIGN_OFF_SECONDS``, and no thread of its own keeps the process alive.

Connections (connection.py). The worker's own calls -- every write above,
every claim, every heartbeat -- go through **one shared connection**,
taken in turns: a turn is one call, whichever thread makes it. A job
thread has a connection of its own only while its handlers use the ORM.
(An atomic job's completion is the one final write on a job thread's own
connection: the last statement of its handler's transaction.)
The listener has its own (a LISTEN needs a session), and so does the
scheduler. So a worker holds 1 + (job threads whose handlers use the
database) + 1 listener on PostgreSQL + 1 with ``--with-scheduler``
connections: 2 at any concurrency when handlers touch no database.

Why the heartbeat shares it and lease renewals still never wait on a slow
write: no turn lasts longer than one call, and no call longer than its
bounds (bounds.py, decision 0030): every call waits at most
``lock_wait()`` for a lock and each of its statements runs at most twice
that, past which its transaction rolled back and nothing was written.
Recovery of an unknown round and the retries of a final write try each
call in a turn of its own and pause outside it, so a main loop blocked
in recovery holds the connection only while a call is on the wire, and
the heartbeat's turns come in between. A call that is itself slow (a
lock wait, a slow server) would hold the lease renewals up, so the
heartbeat waits at most half a beat for its turn, once per beat, and
otherwise makes the whole beat on a second connection until it has its
turn again: a live lease is renewed at least every two beats (two thirds
of a lease), including the leases of jobs whose final write is waiting.
While the shared connection waits for a server that refuses connections,
the beat is skipped: a second connection would be refused too. A worker
that cannot get a connection -- at start or later -- waits with backoff
and jitter, logs it once, and never exits for it.
"""

import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from django.db import close_old_connections, connections

from .. import flow, pooling, signals
from ..bounds import retrying
from ..conf import get_settings
from ..errors import SoniqError, translating
from ..owned import OwnedJobSource
from ..owned.types import queue_names
from ..registry import get_handler, registered_handlers
from ..throughput import ThroughputCounter
from . import leftovers, peers, planner, registration
from .atomic import AtomicRunner, is_atomic
from .capacity import Budget, Slots
from .completer import BatchCompleter, InlineCompleter
from .connection import (SharedConnection, handler_connections, on_own_connection,
                         own_connection)
from .deadlines import Deadlines
from .eventloop import EventLoop
from .execution import Outcome, OutcomeKind, execute
from .flight import Flights, InFlight
from .progress import ProgressWriter
from .throttle import RatePoll
from .heartbeat import Heartbeat
from .threads import JobThreads
from .timeouts import TimeLimit, limit_for
from .wakeup import Listener
from .writes import NOT_RECORDED, RECORDED, Writes

logger = logging.getLogger("soniq_django.worker")

T = TypeVar("T")

#: The longest start-up jitter a worker waits by default (never more than POLL_INTERVAL).
MAX_STARTUP_JITTER = 1.0
#: Once the loop is over, the longest a worker waits for its threads to end, all of them
#: together (an abandoned handler's thread is not waited for past it: decision 0032).
JOIN_SECONDS = 3.0
#: The longest the worker's last writes may take: its throughput counts and its row marked
#: stopped, on the shared connection (a turn, then the calls; decision 0032).
SIGN_OFF_SECONDS = 2.0


class Worker:
    """One worker process's loop. ``run()`` returns when it stops.

    ``startup_jitter``: the longest random delay before the first claim, so
    that many workers started together do not claim together; None (the
    default) is up to ``MAX_STARTUP_JITTER`` or ``POLL_INTERVAL``,
    whichever is shorter, and none in burst mode.

    ``wait_for_leases`` (burst mode): do not exit while other workers'
    leases hold jobs of this worker's queues -- a dead peer's jobs come
    back when its leases lapse, and this worker runs them. A burst worker's
    last log line says how many jobs other workers still hold.
    """

    def __init__(self, *, using: str = "default", queues: list[str] | None = None,
                 concurrency: int = 1, burst: bool = False, max_jobs: int | None = None,
                 worker_id: str | None = None, with_scheduler: bool = False,
                 grace_seconds: float = 30.0, startup_jitter: float | None = None,
                 wait_for_leases: bool = False):
        self.using = using
        self.queues = queues = queue_names(queues)  # ConfigValidationError before any thread
        self.concurrency = concurrency
        self.burst = burst
        self.worker_id = worker_id or str(uuid.uuid4())
        self.with_scheduler = with_scheduler
        self.grace_seconds = grace_seconds
        self.startup_jitter = startup_jitter
        self.wait_for_leases = wait_for_leases
        self.stopping = threading.Event()  # no more claims; finish in-flight jobs
        self.aborted = threading.Event()  # give up on in-flight jobs too
        self.wake = threading.Event()
        self.abandoned = 0
        """Jobs whose handlers still ran when ``run()`` returned (their leases lapse)."""
        self.listener: Listener | None = None  # PostgreSQL: started with the worker
        self.source = OwnedJobSource(using)
        self.shared = SharedConnection(using, self.stopping)
        self.flights = Flights(using=using)
        self.slots = Slots(concurrency)
        self.budget = Budget(max_jobs)
        self.throughput = ThroughputCounter()
        self.writes = Writes(source=self.source, shared=self.shared, worker_id=self.worker_id,
                             queues=queues, budget=self.budget, throughput=self.throughput,
                             stop=self.aborted)
        self.flights.progress = ProgressWriter(self.writes.source, self.source, self.aborted)
        self.atomic = AtomicRunner(self.writes, stop=self.aborted)
        completer = InlineCompleter if concurrency == 1 else BatchCompleter
        self.completer = completer(writes=self.writes, flights=self.flights, slots=self.slots,
                                   wake=self.wake, stopping=self.stopping, aborted=self.aborted)
        self.heartbeat = Heartbeat(source=self.source, shared=self.shared,
                                   worker_id=self.worker_id,
                                   flights=self.flights, throughput=self.throughput,
                                   stopping=self.stopping, aborted=self.aborted,
                                   queues=queues, concurrency=concurrency)
        self.deadlines = Deadlines(time_out=self.completer.time_out, concurrency=concurrency,
                                   is_atomic=is_atomic, is_async=_is_async)
        self.rate_poll = RatePoll(using, queues, self.shared)
        # Each job thread's own connection to the worker's database gets the worker's TCP
        # options once, when the thread starts (connection.py, wire.py).
        self.threads = JobThreads(concurrency, on_start=partial(own_connection, using))
        self.event_loop = EventLoop(self._async_start, self._async_done,
                                    late=self.writes.late, admit=self._admit_late,
                                    threaded=concurrency > 1)
        # What the loop remembers from one round to the next (see planner.Snapshot).
        self._found_nothing = False
        self._requeued_then = 0  # Writes.requeued when the round that found nothing began
        self._unknown_streak = 0
        self._backoff_due = False
        self._held_back_streak = 0  # rounds in a row whose claim a lock held back
        self._claims_held_until: float | None = None
        self._drain_deadline: float | None = None
        self._stop_deadline: float | None = None  # the runs asked to stop are abandoned then
        self._held_elsewhere: int | None = 0  # leased jobs of our queues others hold

    @property
    def claimed_count(self) -> int:
        """Jobs this worker claimed."""
        return self.budget.claimed

    @property
    def short_id(self) -> str:
        """The start of the worker's id, as its log lines name it."""
        return self.worker_id[:8]

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
        """Run until stopped (or, in burst mode, until nothing is left); return an exit code.

        While the database refuses connections the worker waits (it says
        so once); stopped before it could register, it returns 0.
        """
        self.shared.adopt()
        if not self._register():
            self.shared.close()
            logger.info("worker %s stopped before it could register", self.short_id)
            return 0
        logger.info("%s", self._banner())
        background = self._start_background()
        pool = self.threads
        try:
            self.stopping.wait(self._jitter())  # workers started together claim apart
            self._loop(pool)
        finally:
            self.completer.close()
            self.deadlines.close()
            self.stopping.set()
            if self.listener is not None:
                self.listener.interrupt()  # its wait ends now, not at the end of its slice
            self._end_threads(pool, background)
            last_word = _bounded(self._sign_off, SIGN_OFF_SECONDS)
            if last_word is None:
                logger.warning("could not mark worker %s stopped within %g s", self.short_id,
                               SIGN_OFF_SECONDS)
            close_old_connections()
        self.abandoned = len(self.flights)
        logger.info("worker %s stopped after %d jobs%s%s", self.short_id, self.claimed_count,
                    self._summary(), last_word or "")
        return 1 if self.aborted.is_set() else 0

    def _end_threads(self, pool: JobThreads, background: list[threading.Thread]) -> None:
        """Let the worker's threads end: within ``JOIN_SECONDS`` in all.

        Job threads whose handler still runs (abandoned) are daemon threads, as
        every other thread of the worker: none keeps the process alive.
        """
        deadline = time.monotonic() + JOIN_SECONDS  # the bound of every join below

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        pool.shutdown(wait=not self.aborted.is_set(), timeout=left())
        self.event_loop.close(timeout=left())
        for thread in background:
            thread.join(timeout=left())

    def _sign_off(self) -> str:
        """The worker's last writes: its throughput counts, its row marked stopped.

        Returns what a burst worker's last line adds ('' otherwise). Called
        through ``_bounded``: a lock or a server that stopped answering must
        not keep a stopping worker (its row then says stopped once its
        heartbeat is old enough).
        """
        with self.shared.try_turn(SIGN_OFF_SECONDS) as turn:  # the bound: SIGN_OFF_SECONDS
            if not turn:  # an abandoned call holds the connection
                raise TimeoutError
            try:
                self.throughput.flush(self.using)
                registration.unregister(self.using, self.worker_id)
            except Exception:
                logger.warning("could not mark worker %s stopped", self.short_id)
            last_word = self._held_note() if self.burst else ""
            self.shared.close()
            return last_word

    def _banner(self) -> str:
        """The first line a worker logs: who it is, what it serves, how it hears of new jobs."""
        vendor = connections[self.using].vendor
        poll = f"polling every {float(get_settings().POLL_INTERVAL):g} s"
        through = ""
        if vendor == "postgresql":
            listen = get_settings().LISTEN_DATABASE or self.using
            try:
                with self.shared.turn():
                    if pooling.pooled(connections[self.using].connection):
                        through = ", through a pooler"
            except Exception:  # only the banner would miss it
                pass
            wake = f"LISTEN on {listen!r} (tested at start) and {poll}"
        else:
            wake = poll
        handlers = len(registered_handlers())
        extras = [] if self.budget.max_jobs is None else [f"at most {self.budget.max_jobs} jobs"]
        if self.with_scheduler:
            extras.append("with the scheduler")
        extras.append("burst: exits when no job is due (it leaves jobs waiting for a later "
                      "time and those of paused queues)" if self.burst
                      else f"SIGTERM or Ctrl-C stops it (grace {self.grace_seconds:g} s)")
        return (f"worker {self.short_id} started on database {self.using!r} ({vendor}{through}): "
                f"queues {','.join(self.queues) if self.queues else 'all'}, concurrency "
                f"{self.concurrency}, {handlers} handler(s); wake-ups: {wake}; "
                f"{'; '.join(extras)}")

    def _summary(self) -> str:
        """How the jobs this worker settled ended, for its last line ('' when none did)."""
        tally = self.writes.tally
        order = list(dict.fromkeys(r.tally for r in RECORDED.values())) + [NOT_RECORDED]
        parts = [f"{tally[name]} {name}" for name in order if tally[name]]
        if self.abandoned:  # still running when the worker stopped: their leases lapse
            parts.append(f"{self.abandoned} abandoned")
        return f" ({', '.join(parts)})" if parts else ""

    def _register(self) -> bool:
        """Register this worker and its registry; False: stopped before it could."""
        def register() -> bool:
            with self.shared.turn(), translating(self.using):
                registration.register(self.using, self.worker_id, self.queues, self.concurrency)
                registration.publish_registry(self.using, self.worker_id)
                flow.sync_configured(self.using)  # SONIQ["QUEUES"], where every claim reads it
            return True

        return bool(retrying(register, math.inf, self.stopping))

    def _loop(self, pool: JobThreads) -> None:
        """Plan, then act; until the planner says stop."""
        while True:
            step = planner.plan(self._snapshot())
            if isinstance(step, planner.Stop):
                if step.reason is planner.StopReason.GRACE_OVER:
                    logger.warning("abandoning %d job(s) still running %g s after they were "
                                   "asked to stop (they run again once their leases lapse)",
                                   len(self.flights), planner.WIND_UP)
                    self.aborted.set()
                return
            if isinstance(step, planner.Wait):
                self._wait(step)
            elif isinstance(step, planner.StopRuns):
                self._stop_runs(step)
            else:
                self._claim(step.n, pool)

    def _stop_runs(self, step: planner.StopRuns) -> None:
        """The grace period is over: ask every running job to stop (decision 0032).

        A cooperative handler sees it as a cancel (``raise_if_cancelled()``
        raises); a run that ends from now on is given back (``defer_owned``,
        due at once, no attempt spent) by its job thread, while this loop
        goes on writing what is handed over until ``step.deadline``.
        """
        self._stop_deadline = step.deadline
        flights = self.flights.all()
        logger.warning("grace period over; asking %d running job(s) to stop (abandoned if "
                       "still running in %g s)", len(flights), planner.WIND_UP)
        for flight in flights:
            flight.context._request_stop()

    def _snapshot(self) -> planner.Snapshot:
        # Pending writes before free slots: a job thread frees its slot before
        # it hands its completion over, so a round that sees the completion
        # also sees the slot.
        pending = self.completer.pending
        free_slots = self.slots.free
        return planner.Snapshot(
            now=time.monotonic(), aborted=self.aborted.is_set(),
            stopping=self.stopping.is_set(), pending=pending, free_slots=free_slots,
            idle=not pending and not len(self.flights), claims_left=self.budget.left,
            max_jobs_reached=self.budget.reached, found_nothing=self._nothing_found(),
            unknown_streak=self._unknown_streak, backoff_due=self._backoff_due,
            claims_held_until=self._claims_held_until,
            burst=self.burst, wait_for_leases=self.wait_for_leases,
            held_elsewhere=self._held_elsewhere, drain_deadline=self._drain_deadline,
            stop_deadline=self._stop_deadline,
            poll_interval=self._poll_interval(), grace_seconds=self.grace_seconds)

    def _poll_interval(self) -> float:
        """POLL_INTERVAL; after a claim that found nothing, shorter for a rate-limited queue."""
        seconds = float(get_settings().POLL_INTERVAL)
        return self.rate_poll.seconds(seconds) if self._nothing_found() else seconds

    def _nothing_found(self) -> bool:
        """The last claim found the queue empty, and no job went back to it since.

        A failure written while that round was on the wire (by a job thread,
        or the main thread's own write of a timeout) may have queued a job
        again, due at once: the empty answer is out of date then, and a burst
        worker must not exit on it.
        """
        return self._found_nothing and self.writes.requeued == self._requeued_then

    def _claim(self, n: int, pool: JobThreads) -> None:
        """One round: the pending writes, and ``n`` claims; start each job claimed."""
        requeued = self.writes.requeued  # before the round: what it may not have seen
        answer = self.completer.round(n)
        if answer.unknown:
            self._unknown_streak += 1
            self._backoff_due = True
            return
        self._unknown_streak = 0
        if answer.held_back:  # nothing claimed, nothing written: look again after a pause
            self._held_back_streak += 1
            self._claims_held_until = time.monotonic() + planner.backoff(self._held_back_streak)
        elif answer.asked:
            self._held_back_streak = 0
        self.slots.take(len(answer.jobs))
        on_the_loop = []
        on_threads = []
        for flight in self.flights.track_many(answer.jobs, answer.traces):  # one lock for all
            if self.concurrency > 1 and _runs_on_the_loop(flight.claimed.job_name):
                on_the_loop.append(flight)
            else:
                on_threads.append(partial(self._run_jobs, flight))
        if on_threads:  # one hand-over for the round's other jobs
            pool.submit_many(on_threads)
        if on_the_loop:  # one hand-over for the round's async jobs
            self.event_loop.start(on_the_loop)
        if answer.found_nothing:
            self._found_nothing = True  # the queue is empty: wait for news
            self._requeued_then = requeued
            if self.burst and self.wait_for_leases:
                held = self._held()
                self._held_elsewhere = None if held is None else held.leased

    def _held(self) -> "peers.Held | None":
        """What other workers' claims hold of this worker's queues; None: unreadable now."""
        try:
            with self.shared.turn():  # the worker's own connection, as every call of its own
                return peers.held(self.using, self.worker_id, self.queues)
        except SoniqError:
            return None

    def _held_note(self) -> str:
        """A burst worker's last words: the jobs of its queues other workers still hold, and
        the queued ones it leaves (waiting for a later time, or paused)."""
        held = self._held()
        if held is None:
            note = "; the jobs other workers hold could not be counted"
        else:
            note = (f"; other workers still hold {held.jobs} job(s) of its queues "
                    f"({held.leased} under a lease)")
        try:
            with self.shared.turn():
                return note + leftovers.left(self.using, self.queues).note()
        except SoniqError:
            return note + "; the queued jobs it leaves could not be counted"

    def _wait(self, step: planner.Wait) -> None:
        if not step.wake_early:  # a backoff: only an abort cuts it short
            self.aborted.wait(step.seconds)
            self._backoff_due = False
            return
        if step.drain_deadline is not None:
            self._drain_deadline = step.drain_deadline
        # A wake-up that came while busy ends the wait at once.
        woken = self.wake.wait(step.seconds)
        self.wake.clear()
        if not self.stopping.is_set():
            if woken:
                logger.debug("woken up early (a new job, a free slot)")
            else:
                logger.debug("waited %.1f s: looking for jobs again", step.seconds)
        self._found_nothing = False

    def _jitter(self) -> float:
        limit = self.startup_jitter
        if limit is None:
            limit = 0.0 if self.burst else min(MAX_STARTUP_JITTER,
                                               float(get_settings().POLL_INTERVAL))
        return random.uniform(0, limit) if limit > 0 else 0.0

    def _start_background(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self.heartbeat.run, name="soniq-heartbeat",
                                    daemon=True),
                   threading.Thread(target=self.deadlines.run, name="soniq-deadlines",
                                    daemon=True)]
        if connections[self.using].vendor == "postgresql":
            self.listener = Listener(self.using, self.queues, self.wake, self.stopping)
            threads.append(self.listener)
        if self.with_scheduler:
            from ..scheduler import Scheduler

            threads.append(threading.Thread(
                target=on_own_connection(self.using, Scheduler(using=self.using).run_forever),
                args=(self.stopping,),
                name="soniq-scheduler", daemon=True))
        for thread in threads:
            thread.start()
        return threads

    # A job thread -----------------------------------------------------

    def _run_jobs(self, flight: InFlight | None) -> None:
        """Run the job and settle it; then each next job its (inline) completion claimed."""
        while flight is not None:
            if self.writes.late(flight) and not self.writes.may_start(flight):
                flight = self.completer.settle(flight, None)  # no write: its claim is gone
                continue
            try:
                signals.started(flight, self.worker_id, self.using)
                limit = limit_for(flight.claimed.job_name)
                self.deadlines.watch(flight, limit)  # timed out there when it is up
                with handler_connections():  # the job thread's own: its handlers' use only
                    if is_atomic(flight.claimed.job_name):  # completed in its own transaction
                        outcome = self.atomic.run(flight, limit)
                    else:
                        outcome = execute(flight.claimed, flight.context, limit,
                                          started=flight.started,
                                          run_async=self.event_loop.run)
            except Exception:  # execute() never raises; if it did, the lease lapses
                logger.exception("worker error while running %s", flight.claimed.job_name)
                outcome = None
            settled, flight = flight, self.completer.settle(flight, outcome)
            self.deadlines.forget(settled)

    # The event loop's thread ------------------------------------------

    def _async_start(self, flight: InFlight) -> TimeLimit | None:
        """On the event loop's thread: an async job begins; its time limit, watched from now.

        At its deadline the deadline thread takes its final write, and the
        task's own timeout scope (execution.py) cancels it on the loop: this
        task alone, the loop and its other tasks run on.
        """
        signals.started(flight, self.worker_id, self.using)
        limit = limit_for(flight.claimed.job_name)
        self.deadlines.watch(flight, limit)
        return limit

    def _admit_late(self, flight: InFlight) -> bool:
        """Off the event loop: whether a late async run may start (else settled, unwritten)."""
        if self.writes.may_start(flight):
            return True
        self.completer.settle(flight, None)
        return False

    def _async_done(self, flight: InFlight, outcome: Outcome) -> None:
        """On the event loop's thread: an async job ended; settle it without blocking the loop.

        A completion handed to the main loop's next round takes two locks and
        no database call: it is settled here, unless its final write is taken
        or being taken (the deadline thread's, for its timeout). Every other
        final write goes to a job thread.
        """
        try:
            if (outcome.kind is OutcomeKind.DONE and isinstance(self.completer, BatchCompleter)
                    and self.completer.hand_over(flight, outcome)):
                self.deadlines.forget(flight)
            else:
                self.threads.submit(partial(self._settle, flight, outcome))
        except Exception:  # the job threads are shut down: the worker is aborting
            logger.exception("worker error while settling %s", flight.claimed.job_name)

    def _settle(self, flight: InFlight, outcome: Outcome) -> None:
        """On a job thread: the final write of an async job that ran on the event loop."""
        self.completer.settle(flight, outcome)
        self.deadlines.forget(flight)


def _bounded(call: Callable[[], T], seconds: float) -> T | None:
    """``call()`` on a daemon thread of its own, waited for ``seconds`` at most; None past it
    (or when it raised)."""
    answer: list[T] = []

    def run() -> None:
        try:
            answer.append(call())
        except Exception:  # said by the caller: None
            pass

    thread = threading.Thread(target=run, name="soniq-sign-off", daemon=True)
    thread.start()
    thread.join(seconds)  # the bound: the caller's
    return answer[0] if answer else None


def _runs_on_the_loop(job_name: str) -> bool:
    """Whether a job runs on the worker's event loop: an ``async def`` handler, not atomic."""
    handler = get_handler(job_name)
    return handler is not None and handler.is_async and not is_atomic(job_name)


def _is_async(job_name: str) -> bool:
    """Whether the handler of ``job_name`` here is an ``async def`` (cancelled at its deadline)."""
    handler = get_handler(job_name)
    return handler is not None and bool(handler.is_async)
