"""Atomic jobs: a handler's writes and its fenced completion commit together, or not at all.

``@job(atomic=True)``, or a Tasks backend with ``OPTIONS["atomic"]``. The
job thread opens a transaction on its own connection to the jobs database
-- never the worker's shared connection, never the batched completer --
runs the handler inside it, and writes the job's completion as the
transaction's last statement: ``soniq_complete`` on PostgreSQL, its twin on
SQLite, the same fence check as for any job, with the result. Then:

- the fence refuses (the lease lapsed, the job was re-claimed, a cancel was
  requested): everything rolls back, and the log says so;
- the handler raises, or stops for a cancel or its timeout: everything rolls
  back, and its failure, dead letter or cancel acknowledgement is written
  afterwards, as for any job (completer.py); a timeout's failure is written
  at the deadline (deadlines.py), while the handler may still run -- its
  transaction then rolls back when it returns, and nothing it wrote is kept;
- the COMMIT's outcome is unknown (the connection failed there):
  ``Writes.recover_atomic`` asks the job row, which holds the answer, and
  the handler is never run again for this claim.

Locks and heartbeats (decision 0015). On PostgreSQL nothing of soniq's is
locked until the completion, the transaction's last statement: until then
the heartbeat renews the lease on the shared connection, as for any job;
after it the heartbeat leaves the job alone until the COMMIT's outcome is
known (``flight.commit_pending``). The completion is sent with two
transaction-local settings (decision 0030): its wait for the row is
bounded (``bounds.lock_wait()``), and a backend left idle in the
transaction -- a COMMIT lost with its connection -- is ended by the server
after ``bounds.orphan_limit()`` (a third of a lease), releasing the row for
the recovery's fenced failure; the handler's own time is not limited. On SQLite the
transaction takes the database's write lock before the handler runs,
checks the fence then, and holds the lock to the end. No other connection
can write meanwhile -- no heartbeat, but also no re-claim, no cancel
request, no reaper -- so the row stays as it was checked, and the
completion checks the lease as of that moment
(``SqliteClaims.complete(held_since=...)``). The cost: every other writer
waits for the handler to finish.

Writes to another database alias are outside the transaction: the first
one of each job name and alias logs a warning.
"""

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from ..bounds import lock_wait, orphan_limit, retrying
from ..conf import get_settings
from ..errors import RunRolledBack, SoniqError, translate
from ..owned._store import PostgresClaims, claims_for, take_sqlite_write_lock
from ..registry import get_handler
from .execution import Outcome, OutcomeKind, execute
from .flight import InFlight
from .timeouts import TimeLimit
from .writes import Writes

logger = logging.getLogger("soniq_django.worker")

#: The first word of a statement that writes (the other-alias warning looks no further).
WRITE_VERBS = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "REPLACE", "UPSERT",
                         "TRUNCATE", "COPY", "CREATE", "ALTER", "DROP"})

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def is_atomic(job_name: str) -> bool:
    """Whether this process runs ``job_name`` atomically (its handler says ``atomic=True``)."""
    handler = get_handler(job_name)
    return handler is not None and getattr(handler, "atomic", False) is True


@dataclass
class _Run:
    began: bool = False
    undone: Outcome | None = None
    """How the run ended when it rolled back (``RunRolledBack``), before the rollback itself ran."""
    settled: bool = False
    """This run holds ``flight.settled``: the job's final write is its own."""
    committing: bool = False


class AtomicRunner:
    """Runs atomic jobs on the calling thread's own connection to ``writes.using``.

    ``stop``: the worker aborted (nothing more is written). ``durable``:
    refuse to run inside a transaction the caller opened (a worker's job
    thread never has one; ``soniq_django.testing`` runs inside a test's).
    """

    def __init__(self, writes: Writes, *, stop: threading.Event, durable: bool = True):
        self.writes = writes
        self.using = writes.using
        self.stop = stop
        self.durable = durable

    def run(self, flight: InFlight, limit: TimeLimit | None) -> Outcome:
        """Run ``flight``'s handler atomically; never raises.

        A ``written`` outcome's final write is made (``applied`` says how it
        went); any other is written by the completer, as for any job.
        While the transaction cannot begin (the database is unavailable,
        SQLite's write lock is held), it is tried again for up to three
        leases; the handler has not run then.
        """
        deadline = time.monotonic() + 3 * float(get_settings().LEASE_SECONDS)
        try:
            outcome: Outcome | None = retrying(lambda: self._transaction(flight, limit),
                                               deadline, self.stop)
        except SoniqError as error:  # refused at BEGIN: trying again cannot help
            return Outcome(OutcomeKind.RETRY, error=(
                f"the atomic run's transaction could not begin ({error.code.value}: "
                f"{error.reason}); the handler did not run"))
        if outcome is None:
            return Outcome(OutcomeKind.RETRY, error=(
                "the atomic run's transaction could not begin (the database was unavailable, "
                "or SQLite's write lock stayed taken); the handler did not run"))
        return outcome

    def _transaction(self, flight: InFlight, limit: TimeLimit | None) -> Outcome:
        """One try: begin, run, complete, commit. Raises only when it could not begin."""
        connection = connections[self.using]
        run = _Run()
        outcome: Outcome | None = None
        try:
            with transaction.atomic(using=self.using, durable=self.durable):
                if connection.vendor == "sqlite":
                    take_sqlite_write_lock(connection)  # before the handler: held to the end
                run.began = True
                try:
                    outcome = self._inside(flight, limit, connection.vendor == "sqlite", run)
                except RunRolledBack as undo:
                    run.undone = undo.outcome
                    raise
                run.committing = True
        except RunRolledBack as undo:  # rolled back
            undone: Outcome = undo.outcome
            return undone
        except Exception as error:
            if not run.began:
                if isinstance(error, DatabaseError):
                    raise translate(error) from None
                raise
            if run.undone is not None and isinstance(error, DatabaseError):
                # The rollback found the connection dead, and Django's reconnect (to restore
                # autocommit) was refused: the server ends a dead session's transaction itself.
                logger.warning("%s %s: the connection was lost while its atomic run rolled back; "
                               "the database rolled it back, nothing it wrote was kept",
                               flight.claimed.job_name, flight.claimed.job_id)
                return run.undone
            if run.committing and outcome is not None and not isinstance(error, DatabaseError):
                # Django runs on_commit callbacks after the COMMIT: it is made.
                logger.exception("%s %s: an on_commit callback of its atomic run failed after "
                                 "the commit", flight.claimed.job_name, flight.claimed.job_id)
                return outcome
            if run.committing and outcome is not None:  # the COMMIT failed, or its answer did
                # Renewed again while it is recovered: once the server ended the lost
                # transaction (orphan_limit()), the row is free for the renewal and the failure.
                flight.commit_pending = False
                return self.writes.recover_atomic(flight, outcome)
            logger.exception("worker error in the atomic run of %s", flight.claimed.job_name)
            return Outcome(OutcomeKind.RETRY, error=(
                f"the atomic run failed outside its handler ({type(error).__name__}); "
                f"nothing it wrote was kept"))
        finally:
            flight.holds_write_lock = False
            if run.settled:
                flight.settled.release()
        return outcome

    def _inside(self, flight: InFlight, limit: TimeLimit | None, sqlite: bool,
                run: _Run) -> Outcome:
        """In the transaction: the handler, then the fenced completion. Raises ``RunRolledBack``."""
        claimed = flight.claimed
        fence = claimed.claim_fence
        claims = claims_for(self.using)
        held_since = None
        if sqlite:
            held_since = timezone.now()  # the write lock is this transaction's from here on
            state = claims.get_state(fence)
            if state is None:  # the claim went before its run could begin
                flight.lost = True
                raise RunRolledBack(Outcome(OutcomeKind.DONE, written=True, applied=False, error=(
                    "the claim was gone (lease lapsed, cancelled or re-claimed) when its atomic "
                    "run could take SQLite's write lock; the handler did not run")))
            if state[0]:  # a cancel was requested: the completion could only be refused
                raise RunRolledBack(Outcome(OutcomeKind.CANCELLED))
            flight.holds_write_lock = True
        progress = flight.context._progress
        if sqlite and progress is not None:
            # This transaction holds SQLite's one write lock until it ends: the run's
            # progress is written in it, by this thread, before the completion.
            progress.defer(flight.context)
        with _other_aliases_watched(self.using, claimed.job_name):
            outcome = execute(claimed, flight.context, limit, started=flight.started,
                              atomic=True)
        if outcome.kind is not OutcomeKind.DONE:
            raise RunRolledBack(outcome)
        if progress is not None:  # the last value reported, before the completion
            progress.flush(flight.context, here=sqlite)
        timed_out = Outcome(OutcomeKind.RETRY, error=limit.error(atomic=True) if limit else (
            "timed out; the writes of this atomic run are rolled back"))
        if limit is not None and time.monotonic() > limit.deadline(flight.started):
            # Past its deadline, whether or not the deadline thread took the write yet.
            raise RunRolledBack(timed_out)
        if self.stop.is_set():  # aborted: write nothing, as for any job
            raise RunRolledBack(Outcome(OutcomeKind.RETRY, error="the worker was aborted"))
        if not flight.settled.acquire(blocking=False):
            # The deadline thread is taking the final write: the job ran past its time limit.
            raise RunRolledBack(timed_out)
        run.settled = True
        if flight.done:  # the timeout's failure is written
            raise RunRolledBack(timed_out)
        if flight.lost:  # the heartbeat saw the lease go: the fence would refuse
            raise RunRolledBack(replace(outcome, written=True, applied=False))
        ttl = float(get_settings().RESULT_TTL)
        try:
            if isinstance(claims, PostgresClaims) and self.durable:
                # Its lock wait bounded, and the backend ended by the server if the COMMIT
                # never comes (a lost connection): the row is not held past orphan_limit().
                # Not inside a caller's transaction (run_jobs()): the settings would last
                # to the end of the caller's, and limit the caller's own pauses.
                applied = claims.complete_last(fence, outcome.result, ttl, lock_wait(),
                                               orphan_limit())
            elif isinstance(claims, PostgresClaims):
                applied = claims.complete(fence, outcome.result, ttl)
            else:
                applied = claims.complete(fence, outcome.result, ttl, held_since=held_since)
        except (SoniqError, TransactionManagementError) as error:
            raise RunRolledBack(Outcome(OutcomeKind.RETRY, error=_completion_error(error))) from None
        if not applied:
            raise RunRolledBack(replace(outcome, written=True, applied=False))
        flight.done = True  # the final write is this transaction's COMMIT
        flight.commit_pending = not sqlite  # the transaction holds the row until it ends
        return replace(outcome, written=True, applied=True)


def _completion_error(error: SoniqError | TransactionManagementError) -> str:
    if isinstance(error, TransactionManagementError):
        return ("the atomic run's transaction was broken: a query of the handler failed and "
                "the error was caught without a savepoint (transaction.atomic) around it; "
                "nothing it wrote was kept")
    return (f"the atomic run's completion failed ({error.code.value}: {error.reason}); "
            f"nothing it wrote was kept")


@contextmanager
def _other_aliases_watched(using: str, job_name: str) -> Iterator[None]:
    """While the handler runs: warn once per job name and alias at a write to another alias."""
    others = [connections[alias] for alias in connections if alias != using]
    if not others:
        yield
        return
    with ExitStack() as watching:
        for connection in others:
            watching.enter_context(connection.execute_wrapper(
                _warning_on_write(job_name, connection.alias, using)))
        yield


def _warning_on_write(job_name: str, alias: str, using: str) -> Callable[..., Any]:
    def execute(run: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any
                ) -> Any:
        if _writes(sql):
            _warn_once(job_name, alias, using)
        return run(sql, params, many, context)

    return execute


def _writes(sql: object) -> bool:
    """Whether a statement writes, by its first word (no verb is longer than 8 letters)."""
    if not isinstance(sql, str):
        return False
    words = sql.lstrip()[:9].split(None, 1)
    return bool(words) and words[0].upper() in WRITE_VERBS


def _warn_once(job_name: str, alias: str, using: str) -> None:
    with _warned_lock:
        if (job_name, alias) in _warned:
            return
        _warned.add((job_name, alias))
    logger.warning("%s: an atomic job wrote to the database %r, outside its transaction; only "
                   "its writes to %r commit with its completion (docs/exactly-once.md)",
                   job_name, alias, using)
