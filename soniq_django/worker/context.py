"""What a running handler can know about its job, and how it hears of a cancel or a stop."""

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import JobCancelled
from ..progress import checked

if TYPE_CHECKING:
    from ..owned.types import QueueClaimFence
    from .progress import ProgressState, ProgressWriter

if TYPE_CHECKING:
    from ..producer.api import JobInfo

#: Held only while a context's cancel event is made, so two threads never make two.
_MAKING = threading.Lock()

_current: contextvars.ContextVar["JobContext | None"] = contextvars.ContextVar(
    "soniq_current_job", default=None
)


@dataclass
class JobContext:
    """The job a handler is running. Get it with ``current_job()``."""

    job_id: str
    job_name: str
    queue: str
    attempts: int
    max_attempts: int | None
    generation: int = 0
    """This run's claim generation: one higher for every claim of the job, so each run has its
    own (with ``job_id``, it names the run). 0 only outside a claim."""
    _cancel_event: threading.Event | None = field(default=None, repr=False, compare=False)
    """Made on demand (``_cancel()``): most runs never hear of a cancel, nor wait for one."""
    _stop: bool = field(default=False, repr=False, compare=False)
    """The worker asked this run to stop (``_request_stop()``): set before the cancel event."""
    _trace: "tuple[str, str | None] | None" = field(default=None, repr=False, compare=False)
    """The trace context the job was enqueued under (``tracing.Carrier``), when the worker
    traces and the job carries one: its run's span links to it (soniq_django/tracing.py)."""
    _fence: "QueueClaimFence | None" = field(default=None, repr=False, compare=False)
    """The claim's fence, which every write of this run presents (its token never shown)."""
    _progress: "ProgressWriter | None" = field(default=None, repr=False, compare=False)
    """Who writes this run's progress (worker/progress.py); None: nobody (outside a worker)."""
    _progress_state: "ProgressState | None" = field(default=None, repr=False, compare=False)
    _using: str | None = field(default=None, repr=False, compare=False)
    """The jobs database alias the claim is on: where this run's steps are recorded."""
    _step_names: "set[str] | None" = field(default=None, repr=False, compare=False)
    """The step names this run used (each at most once: soniq_django/steps/run.py)."""
    _write_locked: "Callable[[bool], None] | None" = field(default=None, repr=False,
                                                           compare=False)
    """Told True while an atomic step's transaction holds SQLite's write lock, False after:
    the worker's heartbeat then skips its beats, which could only wait for the lock."""

    def _cancel(self) -> threading.Event:
        """The event a cancel sets (made the first time it is needed, by whichever thread)."""
        event = self._cancel_event
        if event is None:
            with _MAKING:
                event = self._cancel_event
                if event is None:
                    event = self._cancel_event = threading.Event()
        return event

    @property
    def idempotency_key(self) -> str:
        """A key for effects outside the database: the job id, the same on every run and retry.

        Send it to a payment API or mail service that deduplicates by key,
        so a second run of the job cannot repeat the effect
        (docs/exactly-once.md).
        """
        return self.job_id

    def set_progress(self, done: int, total: int | None = None, note: str | None = None
                     ) -> None:
        """Report how far the job got: ``done`` of ``total`` (None: unknown), and a note.

        Cheap enough to call in every loop: the value is checked here
        (``ConfigValidationError``, code CONFIG, for counts that are not
        integers >= 0 or a note longer than 1000 characters) and written by
        the worker at most about once a second, the last value always, under
        this run's fence: a run whose claim lapsed writes nothing. Callable
        from plain and ``async def`` handlers alike (it never waits on the
        database). Read it back as ``get_job(id).progress``.
        """
        value = checked(done, total, note)
        writer = self._progress
        if writer is not None:
            writer.offer(self, value)

    def step(self, name: str, fn: "Callable[..., Any]", *args: Any, atomic: bool = False,
             **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` once per job, as the durable step ``name``; return its result.

        Looked up first: a step an earlier run of this job recorded returns
        its recorded result, and ``fn`` is not called (even if the code
        changed since). Else ``fn`` runs and its JSON result is recorded
        under this run's claim. ``atomic=True``: ``fn``'s writes on the
        jobs database and the record commit in one transaction, only if the
        claim still holds at its COMMIT; otherwise the record follows ``fn``
        (at least once). Names are unique within a job. Raises
        ``ConfigValidationError`` (CONFIG, STEP_DUPLICATE, STEP_NOT_JSON,
        STEP_TOO_LARGE), ``StepNotRecorded`` (the claim no longer holds),
        ``JobCancelled``, or what ``fn`` raises. docs/steps.md.
        """
        from ..steps.run import run_step

        return run_step(self, name, fn, args, kwargs, atomic)

    async def astep(self, name: str, fn: "Callable[..., Any]", *args: Any,
                    atomic: bool = False, **kwargs: Any) -> Any:
        """``step`` for ``async def`` handlers; ``fn`` may be a plain or an ``async def``
        function. The same guarantees (soniq_django/steps/run.py says how)."""
        from ..steps.run import arun_step

        return await arun_step(self, name, fn, args, kwargs, atomic)

    def _request_stop(self) -> None:
        """The worker is stopping and its grace period is over: tell the handler to stop.

        The handler hears it as a cancel (``cancel_requested``, ``raise_if_cancelled()``,
        ``wait_for_cancel()``); the worker then gives the job back instead of cancelling it.
        """
        self._stop = True
        self._cancel().set()

    @property
    def cancel_requested(self) -> bool:
        """True once an operator asked to cancel this job (or its lease was lost, or the
        worker's grace period after a stop signal is over: ``stop_requested``)."""
        event = self._cancel_event
        return event is not None and event.is_set()

    @property
    def stop_requested(self) -> bool:
        """True once the worker asked this run to stop: it is stopping, and its grace period
        is over. The job is given back (queued again at once, no attempt spent) when the
        handler raises ``JobCancelled`` or returns from now on."""
        return self._stop

    def raise_if_cancelled(self) -> None:
        """Raise ``JobCancelled`` if a cancel (or a stop) was requested; call it between steps."""
        if self.cancel_requested:
            raise JobCancelled()

    def batch(self) -> "list[JobInfo] | None":
        """The ``JobInfo`` of each member of this job's batch, in the order ``batch()`` was
        given them: for a batch's ``on_complete`` job, its members' outcomes (statuses,
        results, errors). None when this job belongs to no batch. Reads the jobs database
        (the routers' read alias)."""
        from ..workflows import batch_members

        return batch_members(self.job_id)

    def wait_for_cancel(self, timeout: float | None = None) -> bool:
        """Sleep up to ``timeout`` seconds, waking early on a cancel; return whether it came."""
        return self._cancel().wait(timeout)


def current_job() -> JobContext | None:
    """The ``JobContext`` of the job running in this thread or task, or None outside a job."""
    return _current.get()


def bind(context: JobContext) -> "contextvars.Token[JobContext | None]":
    return _current.set(context)


def unbind(token: "contextvars.Token[JobContext | None]") -> None:
    _current.reset(token)
