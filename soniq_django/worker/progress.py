"""Progress a running handler reports (``current_job().set_progress``), coalesced and fenced.

``set_progress`` never touches the database: it checks the value and hands
it here (``offer``), which costs a lock and a dict entry, so a handler may
call it as often as it likes, from a plain function or an ``async def`` on
the worker's event loop. A job's values are written at most once every
``INTERVAL`` seconds -- the first at once, then the latest one each
interval -- by the **progress thread**, made the first time a handler of
this worker reports progress; each write is one turn on the worker's shared
connection (``OwnedJobSource.set_progress_owned``: ``soniq_set_progress``
under the claim's full fence), so a lapsed run writes nothing. Before a
run's final write, the job thread writes the value still pending
(``flush``), so the last value reported is the one kept.

``here`` (``flush(context, here=True)``) writes on the calling thread's own
connection instead of a turn: the writes of ``soniq_django.testing`` (the
caller's connection and transaction), and SQLite's atomic runs, whose
transaction holds SQLite's one write lock for the whole run -- a progress
write from another connection would wait for it. Those contexts are
``deferred``: their values are only kept until the flush.

A failed write (the database unavailable) is logged and dropped: the next
value, or the flush, is written in its turn. Nothing here ever raises into
a handler.
"""

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..bounds import lock_wait
from ..errors import SoniqError
from ..progress import Progress

if TYPE_CHECKING:
    from .context import JobContext

logger = logging.getLogger("soniq_django.worker")

#: At most one write per job in any INTERVAL seconds (the last value always written).
INTERVAL = 1.0


@dataclass
class ProgressState:
    """A run's progress: the value not written yet, and when the last write began."""

    pending: Progress | None = None
    written_at: float = float("-inf")
    writing: bool = False
    deferred: bool = False
    """Kept until the flush, never written by the progress thread (module docstring)."""
    waiting: bool = field(default=False, repr=False)
    """Listed in the writer's waiting list (so listed once)."""


class ProgressWriter:
    """The worker's one writer of progress: ``offer`` from handlers, ``flush`` before a final
    write. ``source``: an ``OwnedJobSource`` whose calls take turns on the shared
    connection (``SharedConnection.turns``); ``here_source`` the plain one."""

    def __init__(self, source: Any, here_source: Any, stopping: threading.Event | None = None,
                 *, background: bool = True):
        self._source = source
        self._here = here_source
        self._stopping = stopping or threading.Event()
        self._background = background
        self._cond = threading.Condition()
        self._waiting: list["JobContext"] = []
        self._thread: threading.Thread | None = None

    def state(self, context: "JobContext") -> ProgressState:
        with self._cond:
            state = context._progress_state
            if state is None:
                state = context._progress_state = ProgressState(
                    deferred=not self._background)
            return state

    def defer(self, context: "JobContext") -> None:
        """Keep ``context``'s values until ``flush(context, here=True)`` (SQLite atomic runs)."""
        self.state(context).deferred = True

    def offer(self, context: "JobContext", value: Progress) -> None:
        """The handler reported ``value``: keep it, and have it written in its turn."""
        state = self.state(context)
        with self._cond:
            state.pending = value
            if state.deferred or state.waiting:
                return
            state.waiting = True
            self._waiting.append(context)
            self._cond.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="soniq-progress",
                                                daemon=True)
                self._thread.start()

    def unwritten(self, context: "JobContext") -> bool:
        """Whether ``context`` has a value pending or being written (no lock: a hint that
        only turns False once its handler returned and the value went out)."""
        state = context._progress_state
        return state is not None and (state.pending is not None or state.writing)

    def flush(self, context: "JobContext", *, here: bool = False) -> None:
        """Write ``context``'s pending value now, after any write of it under way; never raises.

        On the job thread, once the handler returned and before the run's final write.
        """
        state = context._progress_state
        if state is None:
            return
        with self._cond:
            # A write under way is one turn, bounded (bounds.py): wait for it to end.
            self._cond.wait_for(lambda: not state.writing, timeout=30)
            value, state.pending = state.pending, None
            if state.waiting:
                state.waiting = False
                self._waiting.remove(context)
        if value is not None:
            self._write(context, value, here=here)

    def _write(self, context: "JobContext", value: Progress, *, here: bool = False) -> None:
        fence = context._fence
        if fence is None:
            return
        try:
            if here:
                self._here._set_progress(fence, value)
            else:
                self._source._set_progress(fence, value, lock_wait())
        except SoniqError as error:
            logger.warning("%s %s: could not record its progress (%s)", context.job_name,
                           context.job_id, error.code.value)
        except Exception:
            logger.exception("%s %s: could not record its progress", context.job_name,
                             context.job_id)

    def _run(self) -> None:
        while not self._stopping.is_set():
            taken: list[tuple["JobContext", Progress]] = []
            with self._cond:
                now = time.monotonic()
                later = []
                for context in self._waiting:
                    state = context._progress_state
                    assert state is not None
                    if state.pending is None:  # flushed meanwhile
                        state.waiting = False
                        continue
                    if now - state.written_at >= INTERVAL:
                        taken.append((context, state.pending))
                        state.pending, state.writing, state.written_at = None, True, now
                        state.waiting = False
                    else:
                        later.append(context)
                self._waiting = later
                if not taken:
                    due = [c._progress_state.written_at + INTERVAL  # type: ignore[union-attr]
                           for c in later]
                    self._cond.wait(max(0.01, min(due) - now) if due else INTERVAL)
                    continue
            for context, value in taken:
                try:
                    self._write(context, value)
                finally:
                    state = context._progress_state
                    assert state is not None
                    with self._cond:
                        state.writing = False
                        if state.pending is not None and not state.waiting:
                            state.waiting = True
                            self._waiting.append(context)
                        self._cond.notify_all()

    def close(self) -> None:
        """The worker stops: the thread ends at its next look (it is a daemon)."""
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
