"""Run soniq jobs in your own tests: ``run_jobs()``, ``immediate()`` and pytest fixtures.

``run_jobs()`` runs the queued jobs that are due, one after the other, in
the calling thread and on the caller's own connection -- so inside a
``TestCase`` it sees the rows the test wrote, in the test's transaction.
It goes through the worker's own protocol: each job is claimed with a fresh
nonce (``OwnedJobSource.claim_many_owned``), run by the worker's
``execute()``, and its outcome written, fenced, by the worker's
``Writes.write_outcome`` (``complete_owned``, ``fail_owned`` with or without
a retry, ``acknowledge_cancel_owned``). Retries, backoffs, attempt limits
and dead letters are the worker's, not a simulation of them.

``immediate()`` runs each job as it is enqueued (after the commit, for
``enqueue_on_commit``). Add ``pytest_plugins = ["soniq_django.testing"]``
to your root ``conftest.py`` for the ``soniq_run_jobs`` and
``soniq_immediate`` fixtures. See docs/testing.md.

Nothing here imports models at import time: pytest may load this module as
a plugin before Django is set up.
"""

import datetime as dt
import os
import secrets
import threading
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync, sync_to_async

from .errors import ConfigValidationError, ErrorCode, SoniqError

if TYPE_CHECKING:  # not at run time: this module must not import models (see above)
    from .owned.types import ClaimedJob
    from .worker.execution import Outcome
    from .worker.flight import InFlight
    from .worker.timeouts import TimeLimit

__all__ = ["JobRun", "arun_jobs", "immediate", "run_jobs"]

#: The claim owner of every job these helpers run (not a soniq_workers id).
WORKER_ID = f"soniq_django.testing:{os.getpid()}"

_state = threading.local()  # .running: a run_jobs() call is under way in this thread


@dataclass(frozen=True, kw_only=True)
class JobRun:
    """One run of one job by ``run_jobs()``: what the handler did and where the job is now."""

    job_id: uuid.UUID
    job_name: str
    queue: str
    attempt: int
    """The attempt this run was (1 for the first)."""
    outcome: str
    """``done``, ``retry`` (it raised; retried while attempts remain), ``dead`` or ``cancelled``."""
    status: str | None
    """The job's status after the run's fenced write: ``done``, ``queued`` (a retry is
    waiting), ``dead_letter``, ``cancelled``; None once its row is gone."""
    result: Any = None
    """The handler's return value (``done``)."""
    error: str | None = None
    """The traceback or reason of a failed run, as written to ``last_error``."""
    reason: str | None = None
    """The dead-letter reason of a ``dead`` run (``job_not_found``, ``permanent_failure``...)."""


def run_jobs(*, queues: Iterable[str] | None = None, include_scheduled: bool = False,
             now: dt.datetime | None = None, max_jobs: int | None = None,
             raise_exceptions: bool = True, using: str | None = None) -> list[JobRun]:
    """Run the queued jobs that are due until none is left; return one ``JobRun`` per run.

    Jobs a handler enqueues, and retries that are due (``RETRY_BASE_SECONDS``
    0), run in the same call. ``queues`` limits it to those queues;
    ``include_scheduled`` also runs jobs waiting for a later time (a
    ``run_at``, a retry's backoff), and ``now`` those waiting until ``now``
    at the latest: both make such jobs due at once, as the admin's "retry
    now" does. ``max_jobs`` stops after that many runs. ``using`` is the
    jobs' database alias (default: the routers' write alias).

    With ``raise_exceptions`` (the default), the first failed run raises,
    after its outcome was written: the handler's own exception, or
    ``SoniqError(JOB_FAILED)`` when it had none (no handler, arguments that
    do not fit, a non-JSON result). Without it, failures are only recorded.
    Raises ``ConfigValidationError`` for bad options and
    ``SoniqError(ASYNC_CONTEXT)`` while an event loop runs (await
    ``arun_jobs`` there).
    """
    from .producer.api import refuse_event_loop, write_alias

    refuse_event_loop("run_jobs", "arun_jobs")
    options = _Options.checked(queues, include_scheduled, now, max_jobs, raise_exceptions)
    runs: list[JobRun] = []
    _run(write_alias(using), options, runs)
    return runs


def arun_jobs(**options: Any) -> Awaitable[list[JobRun]]:
    """Async twin of ``run_jobs`` (same keyword options): runs it in Django's sync thread."""
    return sync_to_async(run_jobs)(**options)


@contextmanager
def immediate(*, raise_exceptions: bool = True) -> Iterator[list[JobRun]]:
    """Within the block, every enqueue runs the jobs that are due at once, as ``run_jobs()``.

    ``enqueue()``, ``bulk_enqueue()``, ``handler.enqueue()``, their async
    twins and the Tasks backend insert the row, then run it before they
    return; ``enqueue_on_commit`` runs it once the transactions commit (in a
    ``TestCase``: at the exit of ``captureOnCommitCallbacks(execute=True)``).
    A job a running handler enqueues runs after that handler, in the same
    call. A job with a ``run_at`` in the future stays queued. Yields the
    list of runs, filled in as jobs run. With ``raise_exceptions`` a failed
    run's exception propagates from the enqueue call; otherwise it is only
    recorded. Usable as a decorator too.
    """
    from .producer.api import enqueue_listeners

    options = _Options.checked(None, False, None, None, raise_exceptions)
    runs: list[JobRun] = []

    def listener(alias: str) -> None:
        if not getattr(_state, "running", False):  # else the run under way picks it up
            _run(alias, options, runs)

    enqueue_listeners.append(listener)
    try:
        yield runs
    finally:
        enqueue_listeners.remove(listener)


@dataclass(frozen=True)
class _Options:
    queues: list[str] | None
    include_scheduled: bool
    now: dt.datetime | None
    max_jobs: int | None
    raise_exceptions: bool

    @classmethod
    def checked(cls, queues: Any, include_scheduled: Any, now: Any, max_jobs: Any,
                raise_exceptions: Any) -> "_Options":
        if queues is not None:
            if isinstance(queues, str) or not all(type(q) is str and q for q in queues):
                raise ConfigValidationError("queues must be a list of queue names, or None")
            queues = list(queues)
        for name, value in (("include_scheduled", include_scheduled),
                            ("raise_exceptions", raise_exceptions)):
            if type(value) is not bool:
                raise ConfigValidationError(f"{name} must be True or False")
        if now is not None and (not isinstance(now, dt.datetime) or now.utcoffset() is None):
            raise ConfigValidationError("now must be an aware datetime, or None")
        if include_scheduled and now is not None:
            raise ConfigValidationError("give include_scheduled or now, not both")
        if max_jobs is not None and (type(max_jobs) is not int or max_jobs < 1):
            raise ConfigValidationError("max_jobs must be a whole number of at least 1, or None")
        return cls(queues, include_scheduled, now, max_jobs, raise_exceptions)


def _run(alias: str, options: _Options, runs: list[JobRun]) -> None:
    """Claim and run jobs on ``alias`` into ``runs`` until none is due or ``max_jobs`` ran."""
    runner = _Runner(alias, options)
    outer = getattr(_state, "running", False)
    _state.running = True
    try:
        ran = 0
        while options.max_jobs is None or ran < options.max_jobs:
            _bring_forward(alias, options)
            claimed = runner.claim()
            if claimed is None:
                return
            run, raised = runner.run(claimed)
            runs.append(run)
            ran += 1
            if raised is not None and options.raise_exceptions:
                raise raised
    finally:
        _state.running = outer


def _bring_forward(alias: str, options: _Options) -> None:
    """Make the jobs ``include_scheduled``/``now`` ask for due now (the operator's retry-now)."""
    if not options.include_scheduled and options.now is None:
        return
    from .models import Job, JobStatus
    from .operations import retry_now

    waiting = Job.objects.using(alias).filter(status=JobStatus.QUEUED, scheduled_at__isnull=False)
    if options.queues is not None:
        waiting = waiting.filter(queue__in=options.queues)
    if options.now is not None:
        waiting = waiting.filter(scheduled_at__lte=options.now)
    ids = list(waiting.values_list("id", flat=True))
    if ids:
        retry_now(ids, using=alias)


class _Runner:
    """The worker's parts for one thread and one connection: claim, execute, write."""

    def __init__(self, alias: str, options: _Options):
        from .owned import OwnedJobSource
        from .throughput import ThroughputCounter
        from .worker.capacity import Budget
        from .worker.connection import CallersConnection
        from .worker.flight import Flights
        from .worker.writes import Writes

        self.alias = alias
        self.queues = options.queues
        from .worker.progress import ProgressWriter

        self.source = OwnedJobSource(alias)
        # Progress is kept until the run ends, then its last value written on the caller's
        # connection (an async handler runs on a loop in this thread: no query there).
        self.flights = Flights(ProgressWriter(self.source, self.source, background=False),
                              using=alias)
        # Counts kept in memory and never flushed: a test's run is not throughput.
        self.writes = Writes(source=self.source, shared=CallersConnection(alias),
                             worker_id=WORKER_ID, queues=self.queues,
                             budget=Budget(None), throughput=ThroughputCounter(),
                             stop=threading.Event())

    def claim(self) -> "ClaimedJob | None":
        """The next due job, claimed with a fresh nonce; None when none is due."""
        claimed = self.source.claim_many_owned(
            WORKER_ID, claim_tokens=[secrets.token_urlsafe(16)], queues=self.queues,
            pid=os.getpid())
        return claimed[0] if claimed else None

    def run(self, claimed: "ClaimedJob") -> tuple[JobRun, BaseException | None]:
        """Run one claimed job and write its outcome; return the run and what to raise, if any."""
        from .models import DeadLetterReason
        from .worker.execution import Outcome, OutcomeKind, execute

        from .worker.atomic import AtomicRunner, is_atomic
        from .worker.timeouts import limit_for

        from . import signals, tracing

        traces = (tracing.carriers(self.alias, [claimed.claim_fence.job_id])
                  if tracing.recording() else None)
        flight = self.flights.track(claimed, traces)
        signals.started(flight, WORKER_ID, self.alias)  # finished: sent by self.writes
        limit = limit_for(claimed.job_name)
        try:
            if is_atomic(claimed.job_name):  # its writes and completion: one savepoint here
                outcome = AtomicRunner(self.writes, stop=threading.Event(), durable=False).run(
                    flight, limit)
            else:
                outcome = self._execute(execute, flight, limit)
            if outcome.kind is OutcomeKind.UNKNOWN:
                # A worker defers a name it does not know (another release may
                # know it); a test's process knows every handler it will ever
                # have, so the job is dead-lettered at once, as job_not_found.
                outcome = Outcome(OutcomeKind.DEAD, error=outcome.error,
                                  reason=DeadLetterReason.JOB_NOT_FOUND)
            if not outcome.written:
                self.flights.progress.flush(flight.context, here=True)  # type: ignore[union-attr]
            # What the final write recorded, as job_finished says it (a failure
            # with no attempts left: dead, max_retries_exceeded): one story.
            if outcome.written:
                outcome = self.writes.report_atomic(flight, outcome) or outcome
            else:
                outcome = self.writes.write_outcome(flight, outcome) or outcome
        finally:
            self.flights.finish(flight)
        run = JobRun(
            job_id=claimed.job_id, job_name=claimed.job_name, queue=claimed.queue,
            attempt=claimed.attempts, outcome=outcome.kind.value,
            status=_status(self.alias, claimed.job_id), result=outcome.result,
            error=outcome.error, reason=outcome.reason,
        )
        if outcome.kind in (OutcomeKind.DONE, OutcomeKind.CANCELLED):
            return run, None
        return run, outcome.exception or SoniqError(
            ErrorCode.JOB_FAILED,
            f"job {claimed.job_name} was dead-lettered ({outcome.reason}); see JobRun.error")

    def _execute(self, execute: Callable[..., "Outcome"], flight: "InFlight",
                 limit: "TimeLimit | None") -> "Outcome":
        """``execute()`` the handler, in a savepoint when a transaction is open.

        A handler whose query failed inside the caller's transaction leaves
        it aborted on PostgreSQL (in a worker, that query alone would have
        failed): the savepoint is rolled back then, so the fenced write can
        follow. Otherwise the handler's writes are kept, as a worker keeps them.
        """
        from django.db import connections, transaction

        connection = connections[self.alias]
        savepoint = transaction.savepoint(using=self.alias) if connection.in_atomic_block else None
        outcome = execute(flight.claimed, flight.context, limit, started=flight.started,
                          run_async=_on_this_thread)
        if savepoint is not None:
            if _aborted(connection):
                transaction.savepoint_rollback(savepoint, using=self.alias)
            else:
                transaction.savepoint_commit(savepoint, using=self.alias)
        return outcome


def _on_this_thread(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run an ``async def`` handler's coroutine so that its ORM calls use this thread.

    Through ``async_to_sync``, as an atomic job's handler runs: Django's
    async ORM (``sync_to_async``, thread-sensitive) then calls back into the
    caller's thread, so the handler's queries use the caller's connection and
    see (and write in) a ``TestCase``'s transaction. Under ``asyncio.run``
    they would go to asgiref's own thread and another connection.
    """
    async def awaited() -> Any:
        return await coroutine

    return async_to_sync(awaited)()


def _aborted(connection: Any) -> bool:
    """Whether the connection's transaction is aborted by a failed statement (PostgreSQL)."""
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    from psycopg.pq import TransactionStatus

    aborted: bool = connection.connection.info.transaction_status == TransactionStatus.INERROR
    return aborted


def _status(alias: str, job_id: uuid.UUID) -> str | None:
    """The job's status now: its row's, ``dead_letter`` once moved there, else None."""
    from .models import DeadLetterJob, Job

    status: str | None = Job.objects.using(alias).filter(id=job_id).values_list(
        "status", flat=True).first()
    if status is not None:
        return status
    return "dead_letter" if DeadLetterJob.objects.using(alias).filter(id=job_id).exists() else None


# pytest fixtures: ``pytest_plugins = ["soniq_django.testing"]`` in the root
# conftest.py, or import them into a test module or conftest.py. With
# pytest-django they depend on its ``db`` fixture (a test marked
# ``django_db(transaction=True)`` keeps its transactional database).
try:
    import pytest
except ImportError:  # pragma: no cover - pytest is not a dependency of the package
    pytest = None  # type: ignore[assignment]

if pytest is not None:
    try:
        import pytest_django  # noqa: F401
    except ImportError:  # pragma: no cover
        pytest_django = None  # type: ignore[assignment]

    if pytest_django is not None:
        # A static dependency: pytest-django sets the database up for fixtures
        # a test depends on when it is collected, not for getfixturevalue().
        @pytest.fixture
        def soniq_run_jobs(db: None) -> Callable[..., list[JobRun]]:
            """``run_jobs``, with database access for the test (pytest-django's ``db``)."""
            return run_jobs

        @pytest.fixture
        def soniq_immediate(db: None) -> Iterator[list[JobRun]]:
            """Immediate mode for the whole test; yields the list of runs as jobs run."""
            with immediate() as runs:
                yield runs
    else:  # pragma: no cover
        @pytest.fixture
        def soniq_run_jobs() -> Callable[..., list[JobRun]]:
            """``run_jobs``."""
            return run_jobs

        @pytest.fixture
        def soniq_immediate() -> Iterator[list[JobRun]]:
            """Immediate mode for the whole test; yields the list of runs as jobs run."""
            with immediate() as runs:
                yield runs
