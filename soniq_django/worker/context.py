"""What a running handler can know about its job, and how it hears of a cancel."""

import contextvars
import threading
from dataclasses import dataclass, field

from ..errors import JobCancelled

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

    @property
    def cancel_requested(self) -> bool:
        """True once an operator asked to cancel this job (or its lease was lost)."""
        event = self._cancel_event
        return event is not None and event.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise ``JobCancelled`` if a cancel was requested; call it between steps."""
        if self.cancel_requested:
            raise JobCancelled()

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
