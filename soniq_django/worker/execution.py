"""Run one claimed job's handler and say how it ended. No database access here."""

import asyncio
import enum
import inspect
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field, replace
from typing import Any

from asgiref.sync import async_to_sync

from .. import tracing
from ..conf import get_settings
from ..encoding import normalize_json
from ..errors import JobCancelled, PermanentFailure, SoniqError
from ..models import DeadLetterReason
from ..owned.types import ClaimedJob
from ..registry import WHERE_HANDLERS_COME_FROM, JobHandler, get_handler
from .context import JobContext, bind, unbind
from .timeouts import TimeLimit

MAX_ERROR_TEXT = 64 * 1024


class OutcomeKind(enum.Enum):
    """How a handler's run ended, as the worker's final write records it."""

    DONE = "done"
    """It returned a JSON value: ``complete_owned``."""
    RETRY = "retry"
    """It raised (or ran past its deadline): ``fail_owned(retry=True)``."""
    DEAD = "dead"
    """Retrying cannot help: ``fail_owned(retry=False)`` with a dead-letter reason."""
    CANCELLED = "cancelled"
    """It stopped after a cancel request: ``acknowledge_cancel_owned``."""
    UNKNOWN = "unknown"
    """No handler here for the job's name: unknown.py turns it into DEFERRED or DEAD."""
    DEFERRED = "deferred"
    """Left for a worker that knows the name: ``defer_owned``, no attempt spent."""
    STOPPED = "stopped"
    """It ended after the worker asked it to stop (its grace period over): given back with
    ``defer_owned``, due at once, no attempt spent -- or cancelled if a cancel is pending."""


@dataclass(frozen=True)
class Outcome:
    """How a job ended: its kind, with its result, error, dead-letter reason or delay."""

    kind: OutcomeKind
    result: Any = None
    error: str | None = None
    reason: str | None = None
    delay: float | None = None
    """Seconds until the job is due again: a DEFERRED job's, or a RETRY's once the worker
    chose its backoff (writes.py); None otherwise."""
    exception: BaseException | None = field(default=None, repr=False, compare=False)
    """What the handler raised, if it raised (``soniq_django.testing`` can re-raise it)."""
    written: bool = False
    """Its final write is made already: an atomic job's, in the handler's own transaction
    (worker/atomic.py), or by the recovery of that transaction's lost commit."""
    applied: bool | None = None
    """Of a written outcome: True, it committed; False, the fence refused it and the handler's
    writes were rolled back (or never landed); None, unknown (the database never answered)."""


#: The outcome of every run that returned None (most handlers): one object, never a new one.
DONE = Outcome(OutcomeKind.DONE)
#: The outcome of a run that ended after the worker asked it to stop: its ``last_error``.
STOPPED = Outcome(OutcomeKind.STOPPED, error=(
    "the worker stopped before this run finished (its grace period was over); given back "
    "without spending an attempt"))


def _error_text(error: BaseException) -> str:
    text = "".join(traceback.format_exception(error))
    return text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "\n[truncated]"


Keywords = tuple[frozenset[str], frozenset[str]]
#: By ``id`` of a handler's signature (kept with it, so the id is not reused): (every
#: keyword it takes, the ones it needs), or None when only ``Signature.bind`` can tell (it
#: takes ``**kwargs``, or a positional-only parameter; or it is not an
#: ``inspect.Signature``: a Django task's ``TaskSignature``). Signatures with unhashable
#: defaults cannot be dictionary keys themselves.
_KEYWORDS: dict[int, tuple[object, Keywords | None]] = {}


def _keywords(signature: object) -> Keywords | None:
    known = _KEYWORDS.get(id(signature))
    if known is not None and known[0] is signature:
        return known[1]
    if not isinstance(signature, inspect.Signature):  # a resolver's handler: its own bind()
        return None
    params = signature.parameters.values()
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    found = None
    if all(p.kind in by_keyword or p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        found = (frozenset(p.name for p in params if p.kind in by_keyword),
                 frozenset(p.name for p in params
                           if p.kind in by_keyword and p.default is inspect.Parameter.empty))
    _KEYWORDS[id(signature)] = (signature, found)
    return found


def _binds(signature: Any, args: dict[str, Any]) -> None:
    """Raise TypeError if ``args`` cannot be passed to ``signature`` by keyword.

    What ``signature.bind(**args)`` decides, without building its bound
    arguments when a set comparison can tell (the common case).
    """
    keywords = _keywords(signature)
    if keywords is not None and keywords[1] <= args.keys() <= keywords[0]:
        return
    signature.bind(**args)


class _Expired:
    """What ``_run_async`` returns when the deadline cancelled the coroutine."""


_EXPIRED = _Expired()


async def _run_async(handler: JobHandler[..., Any], args: dict[str, Any], context: JobContext,
                     seconds: float | None, span: Any = None) -> Any:
    """The coroutine's value, or ``_EXPIRED`` when it was cancelled after ``seconds``.

    A ``TimeoutError`` the handler raises itself (a socket's, a client's)
    is its own failure, not the job's timeout: only an expired scope is.
    The scope is the running loop's own timer, so on the worker's shared
    event loop it cancels this task alone, without blocking the loop.
    ``span`` (tracing) is current while the handler runs.
    """
    token = bind(context)  # each task has its own context: bind inside it
    active = None if span is None else tracing.activate(span)
    try:
        scope = asyncio.timeout(None if seconds is None else max(seconds, 0.0))
        try:
            async with scope:
                return await handler.func(**args)
        except TimeoutError:
            if scope.expired():
                return _EXPIRED
            raise
    finally:
        if active is not None:
            tracing.deactivate(active)
        unbind(token)


def execute(claimed: ClaimedJob, context: JobContext, limit: TimeLimit | None, *,
            started: float | None = None, atomic: bool = False,
            run_async: Callable[[Coroutine[Any, Any, Any]], Any] | None = None) -> Outcome:
    """Run the job's handler with its stored keyword arguments; never raises.

    ``atomic``: the caller opened the job's transaction on this thread
    (worker/atomic.py). An ``async def`` handler then runs through
    ``async_to_sync`` rather than on an event loop: Django's async ORM
    (``sync_to_async``, thread-sensitive) calls back into this thread, so
    the handler's queries run on this thread's connection, in that
    transaction. Otherwise an ``async def`` handler runs through
    ``run_async`` (the worker's event loop, worker/eventloop.py), or its
    own ``asyncio.run`` without one.

    Unknown job name → unknown (unknown.py decides: deferred, or dead as
    ``job_not_found`` after the grace period); args that do not bind →
    dead (``invalid_arguments``); ``PermanentFailure`` → dead
    (``permanent_failure``); a cancel seen by the handler → cancelled (a
    stop request at the end of the worker's grace period → stopped); a
    non-JSON return value → dead (``permanent_failure``); any other
    exception → retry; an async handler still running at its deadline
    (``started`` plus ``limit``; the whole limit from now when ``started`` is
    None) is cancelled → retry, as "timed out". A plain function cannot be
    stopped: the deadline thread times it out (deadlines.py).

    With tracing on (soniq_django/tracing.py) a job that has a handler here
    runs in a span of its own, current while the handler runs and ended
    with the outcome as its final write will record it (``settled``).
    """
    handler, refused = _prepare(claimed)
    span = _span(claimed, context, handler, refused)
    if refused is not None:
        return _traced(span, claimed, refused)
    assert handler is not None
    seconds = _seconds(limit, started)
    try:
        if handler.is_async and atomic:
            result = async_to_sync(_run_async)(handler, claimed.args, context, seconds, span)
        elif handler.is_async:
            result = (run_async or asyncio.run)(
                _run_async(handler, claimed.args, context, seconds, span))
        else:
            token = bind(context)
            active = None if span is None else tracing.activate(span)
            try:
                result = handler.func(**claimed.args)
            finally:
                if active is not None:
                    tracing.deactivate(active)
                unbind(token)
    except Exception as error:
        return _traced(span, claimed, _failed(error, context))
    return _traced(span, claimed, _returned(claimed, context, result, limit, atomic=atomic))


async def aexecute(claimed: ClaimedJob, context: JobContext, limit: TimeLimit | None, *,
                   started: float | None = None) -> Outcome:
    """``execute`` of an ``async def`` handler, on the running event loop; never raises.

    Cancelled at its deadline (``started`` plus ``limit``) as in ``execute``:
    this task only, the loop's other tasks run on.
    """
    handler, refused = _prepare(claimed)
    span = _span(claimed, context, handler, refused)
    if refused is not None:
        return _traced(span, claimed, refused)
    assert handler is not None
    try:
        result = await _run_async(handler, claimed.args, context, _seconds(limit, started),
                                  span)
    except Exception as error:
        return _traced(span, claimed, _failed(error, context))
    return _traced(span, claimed, _returned(claimed, context, result, limit))


def _span(claimed: ClaimedJob, context: JobContext, handler: JobHandler[..., Any] | None,
          refused: Outcome | None) -> Any:
    """The run's tracing span (started, not yet current); None when the worker does not
    trace, or when no handler here knows the job (it did not run: unknown.py decides)."""
    if not tracing.recording() or (
            handler is None and (refused is None or refused.kind is OutcomeKind.UNKNOWN)):
        return None
    return tracing.job_span(claimed.claim_fence.job_id, claimed.job_name, claimed.queue,
                            claimed.attempts, context._trace)


def _traced(span: Any, claimed: ClaimedJob, outcome: Outcome) -> Outcome:
    """``outcome``, once the run's span (if any) is ended with it as its write will record it."""
    if span is not None:
        final = settled(claimed, outcome)
        kind = OutcomeKind.DEFERRED if final.kind is OutcomeKind.STOPPED else final.kind
        tracing.finish(span, kind.value,
                       dead_letter_reason=None if final.reason is None else str(final.reason),
                       exception=final.exception, error=final.error)
    return outcome


def _seconds(limit: TimeLimit | None, started: float | None) -> float | None:
    """Seconds left to the run's deadline; None: it has no limit."""
    return None if limit is None else limit.remaining(started, time.monotonic())


def _prepare(claimed: ClaimedJob) -> tuple[JobHandler[..., Any] | None, Outcome | None]:
    """The job's handler, or the outcome of a job that cannot run (no handler, bad args)."""
    handler = get_handler(claimed.job_name)
    if handler is None:
        return None, Outcome(OutcomeKind.UNKNOWN,
                             error=f"no handler is registered for job {claimed.job_name!r} "
                                   f"({WHERE_HANDLERS_COME_FROM})")
    try:
        _binds(handler.signature, claimed.args)
    except TypeError as error:
        return None, Outcome(OutcomeKind.DEAD,
                             error=f"args do not fit {claimed.job_name}: {error}",
                             reason=DeadLetterReason.INVALID_ARGUMENTS)
    return handler, None


def _failed(error: Exception, context: JobContext) -> Outcome:
    """The outcome of a handler that raised ``error`` (its own ``TimeoutError`` included)."""
    if isinstance(error, JobCancelled):
        return STOPPED if context.stop_requested else Outcome(OutcomeKind.CANCELLED)
    if isinstance(error, PermanentFailure):
        return Outcome(OutcomeKind.DEAD, error=_error_text(error),
                       reason=DeadLetterReason.PERMANENT_FAILURE, exception=error)
    # The handler's failure is the job's failure.
    return Outcome(OutcomeKind.RETRY, error=_error_text(error), exception=error)


def _returned(claimed: ClaimedJob, context: JobContext, result: Any, limit: TimeLimit | None,
              *, atomic: bool = False) -> Outcome:
    """The outcome of a handler that returned ``result`` (``_EXPIRED``: cancelled at its deadline).
    """
    if result is _EXPIRED and limit is not None:
        return Outcome(OutcomeKind.RETRY, error=limit.error(atomic=atomic))
    if context.cancel_requested:  # it may have returned early: not done
        return STOPPED if context.stop_requested else Outcome(OutcomeKind.CANCELLED)
    if result is None:
        return DONE
    try:
        return Outcome(OutcomeKind.DONE, result=normalize_json(result, "the result"))
    except SoniqError as error:
        return Outcome(OutcomeKind.DEAD,
                       error=f"{claimed.job_name} returned a value that is not JSON "
                             f"({error.reason})",
                       reason=DeadLetterReason.PERMANENT_FAILURE)


def settled(claimed: ClaimedJob, outcome: Outcome) -> Outcome:
    """``outcome`` as its applied final write left the job: the one story the log, the
    ``job_finished`` signal, ``soniq_django.testing`` and the run's span tell.

    A failure with no attempts left was dead-lettered by ``fail_owned``: it is
    DEAD, as ``max_retries_exceeded``, with no retry delay. Any other outcome
    is itself.
    """
    if outcome.kind is OutcomeKind.RETRY and claimed.attempts >= attempt_limit(claimed):
        return replace(outcome, kind=OutcomeKind.DEAD, delay=None,
                       reason=DeadLetterReason.MAX_RETRIES_EXCEEDED)
    return outcome


def attempt_limit(claimed: ClaimedJob) -> int:
    """The attempts the job has: its row's ``max_attempts``, else its handler's or the setting."""
    return claimed.max_attempts or default_max_attempts(claimed.job_name)


def default_max_attempts(job_name: str) -> int:
    """What a job with ``max_attempts`` NULL gets: its handler's retries plus one, or the setting."""
    handler = get_handler(job_name)
    return handler.max_attempts if handler else get_settings().DEFAULT_MAX_ATTEMPTS
