"""How a worker writes: completions and claims in rounds, other outcomes one by one.

Every write goes through ``OwnedJobSource``, fenced; when the database
fails, the outcome is recovered from the nonces and the rows -- never
guessed, never written twice. A final write that returns False is logged
and never retried by id; one that raises QUEUE_PERSISTENCE_FAILED is
recovered or retried with the same fence until the database answers (or
the lease is certainly gone); one the database refuses is logged with its
SQLSTATE and left to its lease.

Every call is made with ``lock_wait=bounds.lock_wait()``: it waits at most
that long for any one lock, and each statement runs at most twice that
(decision 0030). Past it the call's transaction rolled back and nothing was
written (``lock_not_available``): an answer. A round that hit it claimed
nothing -- its nonces unused, no recovery needed -- and is ``held_back``;
its completions are written without the claim, each retried outside the
turn until its deadline, as every final write that hit it is.
"""

import logging
import os
import secrets
import threading
import time
from base64 import urlsafe_b64encode
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from ..bounds import lock_wait, retrying
from ..conf import get_settings
from ..errors import ErrorCode, SoniqError
from .. import signals, tracing
from ..models import Job
from ..owned import OwnedJobSource
from ..owned._store import LOCK_NOT_AVAILABLE, guarded, retry_backoff
from ..owned.types import ClaimedJob, QueueClaimFence
from ..registry import WHERE_HANDLERS_COME_FROM
from ..throughput import ThroughputCounter
from . import unknown
from .capacity import Budget
from .connection import CallersConnection, SharedConnection
from .execution import Outcome, OutcomeKind, settled
from .execution import attempt_limit as _attempt_limit
from .execution import default_max_attempts as _default_max_attempts
from .flight import InFlight

logger = logging.getLogger("soniq_django.worker")


class Recorded(NamedTuple):
    """How a written outcome is named in the log, and counted."""

    verb: str
    counted_as: str | None
    """A column of soniq_throughput; None: not an outcome the dashboard counts."""
    tally: str
    """What the worker's last log line counts it as (``Writes.tally``)."""


#: Each kind of outcome, once its final write is applied.
RECORDED = {
    OutcomeKind.DONE: Recorded("done", "done", "done"),
    OutcomeKind.RETRY: Recorded("failed, will retry", "failed", "to retry"),
    OutcomeKind.DEAD: Recorded("dead-lettered", "dead_lettered", "dead-lettered"),
    OutcomeKind.CANCELLED: Recorded("cancelled", "cancelled", "cancelled"),
    OutcomeKind.DEFERRED: Recorded("deferred (no handler here; no attempt spent)", None,
                                   "deferred"),
    OutcomeKind.UNKNOWN: Recorded("deferred or dead-lettered (no handler here)", None,
                                  "deferred"),
    OutcomeKind.STOPPED: Recorded("given back (the worker stopped before it finished; no "
                                  "attempt spent)", None, "given back"),
}
_EXHAUSTED = Recorded("failed with no attempts left, dead-lettered", "dead_lettered",
                      "dead-lettered")
#: The tally of a final write that was not made (the claim was gone, or refused).
NOT_RECORDED = "not recorded"
#: The longest error text a job's log line carries (``last_error`` has all of it).
MAX_LOGGED_ERROR = 300


def _held(error: SoniqError) -> bool:
    """Whether ``error`` is a call's bound reached (``lock_wait``): rolled back, nothing written."""
    return (error.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
            and error.reason == LOCK_NOT_AVAILABLE)


def nonces(count: int) -> list[str]:
    """``count`` fresh claim nonces, 128 random bits each, read from the system's random
    source in one call rather than one call per nonce.

    Each is 22 characters of URL-safe base64 (``secrets.token_urlsafe(16)``'s form), not
    32 of hex: the same bits in 10 bytes less, which every claimed row carries twice (its
    processing and its finished version) and ``soniq_jobs_claim_token_key`` indexes twice
    -- 16 bytes less per entry once aligned. About 50 bytes of WAL per job
    (docs/performance.md#wal-per-job).
    """
    raw = secrets.token_bytes(16 * count)
    return [urlsafe_b64encode(raw[i:i + 16])[:22].decode() for i in range(0, 16 * count, 16)]


@dataclass(frozen=True)
class Answer:
    """What one round brought back: the jobs it claimed, out of ``asked``."""

    jobs: list[ClaimedJob]
    asked: int
    """Claims the round made (what ``max_jobs`` allowed of those wanted); 0: it only completed."""
    unknown: bool = False
    """The database failed and recovery could not tell whether the claim happened.

    Not an empty queue: a burst worker must not exit on it.
    """
    held_back: bool = False
    """The claim waited on a lock past its bound (``bounds.lock_wait()``) and claimed nothing.

    Known, not unknown: nothing was written. Not an empty queue either.
    """
    traces: "dict[str, tracing.Carrier] | None" = None
    """The trace contexts the claimed jobs carry, by job id; None when the worker does not
    trace (soniq_django/tracing.py): then nothing was read."""

    @property
    def found_nothing(self) -> bool:
        """The round claimed and the queue had nothing eligible."""
        return bool(self.asked) and not self.jobs and not self.unknown and not self.held_back


class Writes:
    """Every fenced write a worker makes for its jobs, through one ``OwnedJobSource``.

    ``round`` is the worker's one claim path: whichever thread claims (the
    main loop, or a job thread's inline completion) claims through it.
    Which thread makes which write is the completer's rule (completer.py);
    every call is one turn on the worker's shared connection (connection.py),
    whichever thread makes it.
    """

    def __init__(self, *, source: OwnedJobSource, shared: SharedConnection | CallersConnection,
                 worker_id: str,
                 queues: list[str] | None, budget: Budget, throughput: ThroughputCounter,
                 stop: threading.Event):
        self.source = shared.turns(source)
        self.shared = shared
        self.using = source.using
        self.worker_id = worker_id
        self.queues = queues
        self.budget = budget
        self.throughput = throughput
        self.stop = stop  # abort: give up retrying
        self.pid = os.getpid()  # recorded with each claim
        self.tally: Counter[str] = Counter()
        """Final writes by how they ended (``Recorded.tally``, or ``NOT_RECORDED``)."""
        self._tally_lock = threading.Lock()
        self._held_back = False  # the last claim met a lock past its bound (logged once)

    @staticmethod
    def late(flight: InFlight) -> bool:
        """Whether ``flight``'s handler must not start before ``may_start`` says so: the
        heartbeat found its claim lost, or half a lease has gone by since the claim
        (no call: the clock only)."""
        return flight.lost or (time.monotonic() - flight.started
                               >= float(get_settings().LEASE_SECONDS) / 2)

    def may_start(self, flight: InFlight) -> bool:
        """Whether ``flight``'s handler may start now: its claim is surely still this worker's.

        A run starts milliseconds after its claim, a whole lease ahead of it.
        One that waited half a lease or more (the process was stopped, a VM
        paused, its threads starved) may find its lease lapsed and the job
        claimed again: its handler would then run beside the next run, past a
        key's or a queue's limit. So such a run's lease is renewed first, in
        one bounded call (``lock_wait()``): renewed, it starts with a whole
        lease ahead; gone, or no answer (nothing then proves it still holds),
        it does not start, and the job runs again once its claim lapses.
        A run the heartbeat found lost does not start either.
        """
        if flight.lost:
            return False
        if not self.late(flight):
            return True  # the claim's lease, granted before ``started``, has half of it left
        claimed = flight.claimed
        try:
            state = self.source.heartbeat_many_owned([claimed.claim_fence],
                                                     lock_wait=lock_wait())[0]
        except SoniqError:
            state = None
        if state is None:
            flight.lost = True
            logger.warning("%s %s: not started; its claim was %.1f s old and could not be "
                           "renewed (lapsed, or the database did not answer): it runs again "
                           "once the claim lapses", claimed.job_name, claimed.job_id,
                           time.monotonic() - flight.started)
            return False
        return True

    def round(self, batch: list[InFlight], wanted: int) -> Answer:
        """Complete ``batch`` and claim up to ``wanted`` jobs, in one call.

        Claims what ``max_jobs`` allows of ``wanted``, each with a fresh nonce
        kept before the call. Every completion of the batch is settled
        (written, or known not to be) and reported before it returns; the
        caller forgets the flights.
        """
        asked = self.budget.reserve(wanted)
        tokens = nonces(asked)  # kept: recovery asks with them
        # A batched flight carries its outcome (completer.py).
        completions = [(flight.claimed.claim_fence,
                        flight.outcome.result)  # type: ignore[union-attr]
                       for flight in batch]
        if not completions and not tokens:
            return Answer([], 0)
        jobs: list[ClaimedJob] = []
        try:
            completed, jobs, unknown, held_back = self._call(completions, tokens)
        finally:
            self.budget.account(asked, len(jobs))
        deadline = time.monotonic() + 3 * float(get_settings().LEASE_SECONDS)
        for flight, applied in zip(batch, completed):
            try:
                self._report(flight, flight.outcome, applied, deadline)  # type: ignore[arg-type]
            except Exception:
                logger.exception("worker error while recording %s", flight.claimed.job_name)
        if asked and logger.isEnabledFor(logging.DEBUG):
            for job in jobs:
                logger.debug("claimed %s %s (attempt %d)", job.job_name, job.job_id, job.attempts)
            if not jobs and not unknown and not held_back:
                logger.debug("claimed nothing: no job is due")
        traces = self._traces(jobs) if jobs and tracing.recording() else None
        return Answer(jobs, asked, unknown, held_back, traces)

    def _traces(self, jobs: list[ClaimedJob]) -> "dict[str, tracing.Carrier]":
        """The trace contexts ``jobs`` carry (one query, a turn of its own; tracing on)."""
        with self.shared.turn():
            return tracing.carriers(self.using, [job.claim_fence.job_id for job in jobs])

    def _call(self, completions: list[tuple[QueueClaimFence, Any]], tokens: list[str]
              ) -> tuple[Sequence[bool | None], list[ClaimedJob], bool, bool]:
        """(completion answers, claimed jobs, whether the claim stayed unknown, whether it was
        held back by a lock)."""
        wait = lock_wait()
        try:
            if completions and tokens:
                completed, jobs = self.source.complete_many_and_claim_owned(
                    completions, claim_tokens=tokens, pid=self.pid, queues=self.queues,
                    lock_wait=wait)
                self._claimed_again()
                return completed, jobs, False, False
            if completions:
                return self.source.complete_many_owned(completions, lock_wait=wait), [], False, \
                    False
            jobs = self.source.claim_many_owned(
                self.worker_id, claim_tokens=tokens, pid=self.pid, queues=self.queues,
                lock_wait=wait)
            self._claimed_again()
            return [], jobs, False, False
        except SoniqError as error:
            if _held(error):  # rolled back: nothing written, the nonces unused
                if not self._held_back:  # once while it lasts
                    logger.warning("a lock another transaction holds kept a round waiting "
                                   "past %.2f s: nothing was written; claiming again after a "
                                   "pause (completions are written without the claim "
                                   "meanwhile)", wait)
                self._held_back = bool(tokens) or self._held_back
                return self._complete_alone(completions), [], False, bool(tokens)
            if error.code is ErrorCode.QUEUE_PERSISTENCE_FAILED:
                return (*self._recover(completions, tokens), False)
            if completions:  # the claim was refused: the completions must still be written
                logger.warning("claim refused (%s: %s); completing without it",
                               error.code.value, error.reason)
                return self._complete_alone(completions), [], False, False
            # Not an outage: say what the database said, and try again later.
            logger.error("claim refused (%s: %s); trying again shortly",
                         error.code.value, error.reason)
            return [], [], True, False

    def _claimed_again(self) -> None:
        """A claim went through: say so if a lock had held claims back."""
        if self._held_back:
            self._held_back = False
            logger.info("claims go through again (the lock that held them back is gone)")

    def _recover(self, completions: list[tuple[QueueClaimFence, Any]], tokens: list[str]
                 ) -> tuple[Sequence[bool | None], list[ClaimedJob], bool]:
        """After a call whose outcome is unknown: what was completed, and what was claimed.

        The call was one transaction that handed out its nonces in order, so
        a live claim under the first nonce proves everything committed; a
        completion is then found in the row itself. Otherwise each completion
        is sent again with its fence.
        """
        logger.warning("outcome unknown (database unavailable); recovering")
        deadline = time.monotonic() + 3 * float(get_settings().LEASE_SECONDS)
        claimed: list[ClaimedJob] = []
        for token in tokens:
            job = retrying(lambda token=token: self.source.recover_owned_claim(
                self.worker_id, claim_token=token, lock_wait=lock_wait()), deadline, self.stop)
            if job is None:
                break
            claimed.append(job)
        completed = [
            retrying(lambda fence=fence, result=result: self._completed(fence)
                      or self.source.complete_owned(fence, result, lock_wait=lock_wait()),
                      deadline, self.stop)
            for fence, result in completions
        ]
        # Nothing recovered proves nothing about the queue: the claim stays unknown.
        return completed, claimed, bool(tokens) and not claimed

    def _complete_alone(self, completions: list[tuple[QueueClaimFence, Any]]
                        ) -> list[bool | None]:
        """Write completions without a claim: in one call, retried while a lock holds it.

        Each try is a turn of its own, the pauses outside it. After an
        unknown outcome (the database failed) each completion is recovered
        on its own: found done under its claim, or written again.
        """
        if not completions:
            return []
        deadline = time.monotonic() + 3 * float(get_settings().LEASE_SECONDS)
        failed = threading.Event()

        def once() -> list[bool] | None:
            try:
                return self.source.complete_many_owned(completions, lock_wait=lock_wait())
            except SoniqError as error:
                if error.code is ErrorCode.QUEUE_PERSISTENCE_FAILED and not _held(error):
                    failed.set()  # unknown: recover one by one
                    return None
                raise

        completed: list[bool] | None = retrying(once, deadline, self.stop)
        if completed is not None:
            return list(completed)
        if not failed.is_set():
            return [None] * len(completions)
        return list(self._recover(completions, [])[0])

    def _completed(self, fence: QueueClaimFence) -> bool:
        """Whether this claim's completion is in the database (it was written unseen)."""
        with self.shared.turn(), guarded(self.using, atomic=False):
            found: bool = Job.objects.using(self.using).filter(
                id=fence.job_id, status="done", claim_token=fence.claim_token,
                claim_generation=fence.generation,
            ).exists()
            return found

    # Atomic jobs (worker/atomic.py) ---------------------------------------

    def recover_atomic(self, flight: InFlight, outcome: Outcome) -> Outcome:
        """An atomic job's commit whose outcome is unknown: what the database says happened.

        The completion was the transaction's last write, so the row tells:
        done under this claim's nonce and generation, and the handler's
        writes committed with it. Not yet visible: a fenced failure (retry)
        decides, because it waits for the row lock the lost transaction
        held until it ended -- applied, the commit never happened and the
        job runs again under a new claim; refused, the row is read once
        more. The handler is never run again for this claim.
        """
        claimed = flight.claimed
        fence = claimed.claim_fence
        logger.warning("%s %s: the commit of its atomic run was not acknowledged; recovering "
                       "its outcome from the database", claimed.job_name, claimed.job_id)
        error = ("the commit of this atomic run was lost (the connection failed at COMMIT) "
                 "and the database shows it did not happen: none of its writes were kept")

        delay = None
        if claimed.attempts < _attempt_limit(claimed):  # as write_outcome: the log says it
            config = get_settings()
            delay = min(YEAR, retry_backoff(claimed.attempts, float(config.RETRY_BASE_SECONDS),
                                            float(config.RETRY_MAX_SECONDS)))

        def decide() -> Outcome:
            if self._completed(fence):
                return replace(outcome, written=True, applied=True)
            if self.source.fail_owned(fence, error, retry=True, retry_delay=delay,
                                      default_max_attempts=_default_max_attempts(
                                          claimed.job_name), lock_wait=lock_wait()):
                return Outcome(OutcomeKind.RETRY, error=error, delay=delay, written=True,
                               applied=True)
            return replace(outcome, written=True, applied=self._completed(fence))

        deadline = time.monotonic() + 3 * float(get_settings().LEASE_SECONDS)
        try:
            decided = retrying(decide, deadline, self.stop)
        except SoniqError as error:  # refused, not unavailable
            logger.error("%s %s: recovery refused by the database (%s: %s)", claimed.job_name,
                         claimed.job_id, error.code.value, error.reason)
            decided = None
        return decided or replace(outcome, written=True, applied=None)

    def report_atomic(self, flight: InFlight, outcome: Outcome) -> Outcome | None:
        """Log and count an atomic job's outcome, written in its own transaction (or recovered).

        Returns the outcome as recorded and signalled (``settled``), None when none was.
        """
        claimed = flight.claimed
        if outcome.applied:
            deadline = time.monotonic() + 3 * float(get_settings().LEASE_SECONDS)
            return self._report(flight, outcome, True, deadline)
        if outcome.applied is None:
            self._count(NOT_RECORDED)
            logger.error("%s %s: whether its atomic run committed is unknown (the database did "
                         "not answer in time); the row says: done under this claim, and its "
                         "writes committed with it; otherwise none did and the job runs again "
                         "once its lease lapses", claimed.job_name, claimed.job_id)
            return None
        fence = claimed.claim_fence
        deadline = time.monotonic() + 3 * float(get_settings().LEASE_SECONDS)
        if self._cancel_pending(fence) and retrying(
                lambda: self.source.acknowledge_cancel_owned(fence, lock_wait=lock_wait()),
                deadline, self.stop):
            self._count(RECORDED[OutcomeKind.CANCELLED].tally)
            elapsed = time.monotonic() - flight.started
            logger.info("%s %s cancelled after %.3fs (attempt %d); its writes were rolled back",
                        claimed.job_name, claimed.job_id, elapsed, claimed.attempts)
            cancelled = Outcome(OutcomeKind.CANCELLED)
            self._signal(flight, cancelled, elapsed)
            return cancelled
        signals.refused(flight, _signalled(outcome.kind), worker_id=self.worker_id,
                        using=self.using, duration=time.monotonic() - flight.started)
        self._count(NOT_RECORDED)
        logger.warning("%s %s: %s", claimed.job_name, claimed.job_id, outcome.error or (
            "completion refused by the fence (lease lost, cancelled or re-claimed); its writes "
            "were rolled back"))
        return None

    def write_outcome(self, flight: InFlight, outcome: Outcome, *,
                      hold: bool = False) -> Outcome | None:
        """Make one job's final write on its own, retried while the database is unavailable.

        Returns the outcome as recorded and signalled (``settled``: a failure
        with no attempts left is dead), None when no final write was recorded.

        ``hold`` (a timeout's failure, whose handler may run on): the failure
        also holds the claim's queue slot, in the same transaction
        (``flight.holding``; ``release_hold`` gives it back).
        """
        claimed = flight.claimed
        if flight.lost:  # the heartbeat saw the claim go: it is not ours to write
            self._count(NOT_RECORDED)
            logger.warning("%s %s: %s not recorded; the lease was lost", claimed.job_name,
                           claimed.job_id, RECORDED[outcome.kind].verb)
            return None
        fence = claimed.claim_fence
        if outcome.kind is OutcomeKind.UNKNOWN:  # deferred or dead: unknown.py's rule
            outcome = unknown.resolve(self.shared, self.worker_id, claimed, outcome.error)
        # Each kind of Outcome carries its error (and DEAD its reason, DEFERRED
        # its delay): execution.py and unknown.py set them; the types cannot say so.
        if outcome.kind is OutcomeKind.DONE:
            write = lambda: self.source.complete_owned(  # noqa: E731
                fence, outcome.result, lock_wait=lock_wait())
        elif outcome.kind is OutcomeKind.RETRY:
            if claimed.attempts < _attempt_limit(claimed):
                # The backoff soniq_fail would choose, chosen here so that the log says it.
                config = get_settings()
                outcome = replace(outcome, delay=min(YEAR, retry_backoff(
                    claimed.attempts, float(config.RETRY_BASE_SECONDS),
                    float(config.RETRY_MAX_SECONDS))))
            write = lambda: self.source.fail_owned(  # noqa: E731
                fence, outcome.error, retry=True,  # type: ignore[arg-type]
                retry_delay=outcome.delay,
                default_max_attempts=_default_max_attempts(claimed.job_name),
                lock_wait=lock_wait())
            if hold:
                flight.holding = True  # before the call: released even if its outcome is unknown
                write = lambda: self.source._fail_and_hold(  # noqa: E731
                    fence, outcome.error, retry_delay=outcome.delay,  # type: ignore[arg-type]
                    default_max_attempts=_default_max_attempts(claimed.job_name),
                    lock_wait=lock_wait())
        elif outcome.kind is OutcomeKind.DEAD:
            write = lambda: self.source.fail_owned(  # noqa: E731
                fence, outcome.error, retry=False,  # type: ignore[arg-type]
                dead_letter_reason=outcome.reason,  # type: ignore[arg-type]
                lock_wait=lock_wait())
        elif outcome.kind is OutcomeKind.DEFERRED:
            write = lambda: self.source.defer_owned(  # noqa: E731
                fence, outcome.error, delay=outcome.delay,  # type: ignore[arg-type]
                lock_wait=lock_wait())
        elif outcome.kind is OutcomeKind.STOPPED:  # refused while a cancel is pending: see below
            write = lambda: self.source.defer_owned(  # noqa: E731
                fence, outcome.error, delay=0, lock_wait=lock_wait())  # type: ignore[arg-type]
        else:
            write = lambda: self.source.acknowledge_cancel_owned(  # noqa: E731
                fence, lock_wait=lock_wait())
        deadline = time.monotonic() + 3 * float(get_settings().LEASE_SECONDS)
        try:
            applied = retrying(write, deadline, self.stop)
        except SoniqError as error:  # refused, not unavailable: retrying cannot help
            self._count(NOT_RECORDED)
            logger.error("%s %s: %s refused by the database (%s: %s); its lease will lapse "
                         "and the reaper settles it", claimed.job_name, claimed.job_id,
                         RECORDED[outcome.kind].verb, error.code.value, error.reason)
            return None
        return self._report(flight, outcome, applied, deadline)

    def release_hold(self, flight: InFlight) -> None:
        """The timed-out handler of ``flight`` returned: delete the hold of its queue slot.

        Tried while the database is unavailable for at most one lease: by
        then the hold, which nothing renews any more, has lapsed anyway.
        """
        claimed = flight.claimed
        deadline = time.monotonic() + float(get_settings().LEASE_SECONDS)  # bound: one lease
        try:
            released = retrying(lambda: self.source._release_hold(claimed.claim_fence),
                                deadline, self.stop)
        except SoniqError as error:  # refused, not unavailable
            logger.error("%s %s: its queue slot could not be given back (%s: %s); it is "
                         "given back when the hold's lease lapses", claimed.job_name,
                         claimed.job_id, error.code.value, error.reason)
            return
        if released is None:
            logger.warning("%s %s: its queue slot could not be given back (database "
                           "unavailable); it is given back when the hold's lease lapses",
                           claimed.job_name, claimed.job_id)

    def _report(self, flight: InFlight, outcome: Outcome, applied: bool | None,
                deadline: float) -> Outcome | None:
        """Log and count a final write; honour a cancel that refused it.

        Returns the outcome recorded and signalled, None when none was.
        """
        claimed = flight.claimed
        fence = claimed.claim_fence
        elapsed = time.monotonic() - flight.started
        if applied:
            final = settled(claimed, outcome)
            recorded = _EXHAUSTED if final is not outcome else RECORDED[outcome.kind]
            if recorded.counted_as is not None:
                self.throughput.add(claimed.queue, recorded.counted_as)
            self._count(recorded.tally)
            _log_outcome(claimed, outcome, recorded, elapsed)
            self._signal(flight, final, elapsed)
            return final
        if outcome.kind is not OutcomeKind.CANCELLED and self._cancel_pending(fence):
            # A cancel arrived while the handler was finishing: honour it.
            if retrying(lambda: self.source.acknowledge_cancel_owned(
                    fence, lock_wait=lock_wait()), deadline, self.stop):
                self._count(RECORDED[OutcomeKind.CANCELLED].tally)
                logger.info("%s %s cancelled after %.3fs (attempt %d)", claimed.job_name,
                            claimed.job_id, elapsed, claimed.attempts)
                cancelled = Outcome(OutcomeKind.CANCELLED)
                self._signal(flight, cancelled, elapsed)
                return cancelled
        if applied is False:  # None: the database never answered, no fence refused it
            signals.refused(flight, _signalled(outcome.kind), worker_id=self.worker_id,
                            using=self.using, duration=elapsed)
        self._count(NOT_RECORDED)
        logger.warning("%s %s: %s not recorded; the job is no longer this worker's "
                       "(lease lost, cancelled or re-claimed)", claimed.job_name,
                       claimed.job_id, RECORDED[outcome.kind].verb)
        return None

    def _signal(self, flight: InFlight, outcome: Outcome, elapsed: float) -> None:
        """Send ``job_finished`` for an applied final write, ``settled`` (signals.py)."""
        if not signals.job_finished.receivers:
            return
        kind = outcome.kind
        failed = kind in (OutcomeKind.RETRY, OutcomeKind.DEAD)
        signals.finished(
            flight, _signalled(kind), worker_id=self.worker_id,
            using=self.using, duration=elapsed, error=_why(outcome) if failed else None,
            exception=outcome.exception if failed else None,
            dead_letter_reason=(str(outcome.reason) if kind is OutcomeKind.DEAD
                                and outcome.reason is not None else None),
            retry_in=outcome.delay if kind is OutcomeKind.RETRY else None)

    @property
    def requeued(self) -> int:
        """Final writes made so far that queued a job again: failures with attempts left."""
        with self._tally_lock:
            return self.tally[RECORDED[OutcomeKind.RETRY].tally]

    def _count(self, tally: str) -> None:
        with self._tally_lock:
            self.tally[tally] += 1

    def _cancel_pending(self, fence: QueueClaimFence) -> bool:
        try:
            state = self.source.get_owned_state(fence, lock_wait=lock_wait())
        except SoniqError:
            return False
        return state is not None and state.cancel_requested


#: The longest retry delay the claim protocol accepts (a year; RETRY_MAX_SECONDS is checked too).
YEAR = 31536000.0


def _log_outcome(claimed: ClaimedJob, outcome: Outcome, recorded: Recorded,
                 elapsed: float) -> None:
    """The job's one line: how it ended, after how long, at which attempt -- never its args."""
    name, job_id, attempt = claimed.job_name, claimed.job_id, claimed.attempts
    if recorded is _EXHAUSTED:
        logger.error("%s %s failed after %.3fs (attempt %d of %d) and has no attempts left: "
                     "dead-lettered (max_retries_exceeded): %s", name, job_id, elapsed, attempt,
                     _attempt_limit(claimed), _why(outcome))
    elif outcome.kind is OutcomeKind.RETRY:
        logger.warning("%s %s failed after %.3fs (attempt %d of %d), will retry in %s: %s",
                       name, job_id, elapsed, attempt, _attempt_limit(claimed),
                       "its backoff" if outcome.delay is None else f"{outcome.delay:.1f}s",
                       _why(outcome))
    elif outcome.kind is OutcomeKind.DEAD:
        logger.error("%s %s dead-lettered (%s) after %.3fs (attempt %d): %s", name, job_id,
                     outcome.reason, elapsed, attempt, _why(outcome))
    elif outcome.kind is OutcomeKind.DEFERRED:
        logger.info("%s %s %s, due again in %.1fs; %s", name, job_id, recorded.verb,
                    outcome.delay or 0.0, WHERE_HANDLERS_COME_FROM)
    else:
        logger.info("%s %s %s after %.3fs (attempt %d)", name, job_id, recorded.verb, elapsed,
                    attempt)


def _signalled(kind: OutcomeKind) -> str:
    """The ``outcome`` the signals (and the metrics) name: a stopped run's is a deferral."""
    return OutcomeKind.DEFERRED.value if kind is OutcomeKind.STOPPED else kind.value


def _why(outcome: Outcome) -> str:
    """What went wrong, in one line: the exception's type and message (``last_error`` has more).

    A handler's exception message is its own text; the worker adds nothing of the job's args.
    """
    error = outcome.exception
    if error is not None and str(error):
        text = f"{type(error).__name__}: {error}"
    elif outcome.error and not outcome.error.startswith("Traceback"):
        text = outcome.error.splitlines()[0]  # the worker's own words: a timeout, bad args...
    elif error is not None:
        text = type(error).__name__
    else:
        text = "no error text"
    text = " ".join(text.split())
    return text if len(text) <= MAX_LOGGED_ERROR else text[:MAX_LOGGED_ERROR - 3] + "..."
