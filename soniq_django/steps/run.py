"""``current_job().step()`` and ``astep()``: run a step once per job, or return its record.

A step is looked up first (``soniq_get_step``): recorded by an earlier run
of the job, its result comes back and its function is not called. Else the
function runs, its result is checked (JSON, at most ``STEP_MAX_BYTES``) and
recorded under the claim's fence (``soniq_record_step``):

- not atomic: the function runs as the handler's own code does, and the
  record is written after it returns, in a statement of its own. A crash
  in between runs the function again on the next attempt: at least once.
- atomic: the function runs inside a transaction on the thread's
  connection to the jobs database, and the record is that transaction's
  last statement -- as an atomic job's completion is (worker/atomic.py,
  whose bounds it shares): the function's writes and the record commit
  together, and only if the claim still held when the record locked the
  job's row. On SQLite the transaction takes the write lock before the
  function runs and the fence is checked as of then, as an atomic job's.
  A COMMIT whose answer was lost is settled from the database: the job's
  row is locked once the lost transaction is over (a fenced heartbeat,
  which also renews the lease), then the record is read back; the function
  is never called again by this run.

Inside a transaction the caller opened (an atomic job, ``soniq_django.testing``)
the step's transaction is a savepoint of it and commits with it.
"""

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction
from django.utils import timezone

from .. import signals
from ..bounds import lock_wait, orphan_limit, retrying
from ..conf import get_settings
from ..encoding import normalize_json
from ..errors import (ConfigValidationError, ErrorCode, JobCancelled, SoniqError,
                      StepNotRecorded)
from ..owned._store import claims_for, take_sqlite_write_lock
from .store import Lookup, PostgresSteps, SqliteSteps, steps_for

Store = PostgresSteps | SqliteSteps

if TYPE_CHECKING:
    from ..owned.types import QueueClaimFence
    from ..worker.context import JobContext

logger = logging.getLogger("soniq_django.steps")

#: The longest step name, in characters (the SQL function says the same).
MAX_NAME = 200

_LOST = ("the run's claim no longer holds (its lease lapsed, or the job was re-claimed): "
         "the step was not recorded")


def checked_name(name: Any) -> str:
    """``name`` if it is a step name: a string of 1 to ``MAX_NAME`` characters, no NUL."""
    if not isinstance(name, str):
        raise ConfigValidationError(f"step: name must be a string, not {type(name).__name__}")
    if not name or len(name) > MAX_NAME or "\x00" in name:
        raise ConfigValidationError(
            f"step: name must be 1 to {MAX_NAME} characters, without NUL")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigValidationError("step: name holds a lone surrogate") from None
    return name


def encoded(name: str, result: Any, limit: int) -> tuple[str, int]:
    """The JSON text of a step's result and its size in bytes (of that text, items separated
    by ", " and ": " as PostgreSQL prints jsonb); raises STEP_NOT_JSON or
    STEP_TOO_LARGE (the reason names the step and the sizes, never the value)."""
    try:
        plain = normalize_json(result, "the step result")
    except SoniqError as error:
        raise ConfigValidationError(f"step {name!r} returned a value that is not JSON "
                                    f"({error.reason})", code=ErrorCode.STEP_NOT_JSON) from None
    # Measured as PostgreSQL prints jsonb (", " and ": " between items), so both databases
    # and soniq_record_step count a result alike (but for unusual spellings of numbers).
    text = json.dumps(plain, ensure_ascii=False, separators=(", ", ": "), allow_nan=False)
    size = len(text.encode("utf-8"))
    if size > limit:
        raise ConfigValidationError(
            f"step {name!r}: its result is {size:,} bytes as JSON, more than "
            f"SONIQ['STEP_MAX_BYTES'] ({limit:,}); record an id and keep the data elsewhere",
            code=ErrorCode.STEP_TOO_LARGE)
    return text, size


def _started(context: "JobContext", name: str) -> tuple["QueueClaimFence", str]:
    """The run's fence and alias, once ``name`` is known to be new in this run."""
    fence, alias = context._fence, context._using
    if fence is None or alias is None:
        raise ConfigValidationError("step() needs a job run by a worker (or soniq_django."
                                    "testing): there is no claim to record it under")
    names = context._step_names
    if names is None:
        names = context._step_names = set()
    if name in names:
        raise ConfigValidationError(f"step {name!r} was already run in this job: step names "
                                    f"are unique within a job", code=ErrorCode.STEP_DUPLICATE)
    names.add(name)
    return fence, alias


def _refused(context: "JobContext", reason: str = _LOST) -> SoniqError:
    """What a step whose record the fence refused raises: a cancel, or the claim lost."""
    if context.cancel_requested:
        return JobCancelled("a cancel was requested: the step was not recorded")
    return StepNotRecorded(reason)


def run_step(context: "JobContext", name: Any, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], atomic: bool) -> Any:
    """``current_job().step(name, fn, *args, atomic=..., **kwargs)``: see the module docstring.

    Returns the step's result as recorded (a JSON round trip of what ``fn``
    returned, or what an earlier run recorded). Raises CONFIG for a bad name
    or outside a job, STEP_DUPLICATE for a name used twice in this run,
    STEP_NOT_JSON / STEP_TOO_LARGE for a result that cannot be recorded,
    ``JobCancelled`` when a cancel stopped the record, ``StepNotRecorded``
    when the claim no longer holds, QUEUE_PERSISTENCE_FAILED when the
    database did not answer; whatever ``fn`` raises, unrecorded.
    """
    name = checked_name(name)
    fence, alias = _started(context, name)
    store = steps_for(alias)
    found = store.get(fence, name)
    if not found.held:
        raise _refused(context)
    if found.recorded:
        signals.step(False, job_id=context.job_id, job_name=context.job_name, name=name,
                     attempt=context.attempts, atomic=atomic, size=None, using=alias)
        return found.result
    limit = int(get_settings().STEP_MAX_BYTES)
    if atomic:
        text, size = _atomic(context, store, fence, alias, name, limit,
                             lambda: fn(*args, **kwargs))
    else:
        text, size = encoded(name, fn(*args, **kwargs), limit)
        if not store.record(fence, name, text, size, limit):
            raise _refused(context)
    signals.step(True, job_id=context.job_id, job_name=context.job_name, name=name,
                 attempt=context.attempts, atomic=atomic, size=size, using=alias)
    return json.loads(text)


def _atomic(context: "JobContext", store: "Store", fence: "QueueClaimFence", alias: str, name: str,
            limit: int, call: Callable[[], Any]) -> tuple[str, int]:
    """Run ``call`` and record its result in one transaction; the record is its last statement."""
    connection = connections[alias]
    outermost = not connection.in_atomic_block
    sqlite = connection.vendor == "sqlite"
    recorded: tuple[str, int] | None = None
    locked = context._write_locked if sqlite and outermost else None
    try:
        with transaction.atomic(using=alias):
            held_since = None
            if sqlite:
                take_sqlite_write_lock(connection)  # before the function: held to the end
                held_since = timezone.now()
                if locked is not None:  # the heartbeat could only wait for it meanwhile
                    locked(True)
                if not store.get(fence, name).held:
                    raise _refused(context)
            text, size = encoded(name, call(), limit)
            last = (lock_wait(), orphan_limit()) if outermost and not sqlite else None
            if not store.record(fence, name, text, size, limit, last=last,
                                held_since=held_since):
                raise _refused(context)
            recorded = (text, size)
    except DatabaseError:
        if recorded is None or not outermost:  # the function's own error, or a savepoint's
            raise
        return _settle(context, store, fence, alias, name, recorded)
    finally:
        if locked is not None:
            locked(False)
    assert recorded is not None
    return recorded


def _settle(context: "JobContext", store: "Store", fence: "QueueClaimFence", alias: str, name: str,
            recorded: tuple[str, int]) -> tuple[str, int]:
    """The COMMIT of an atomic step whose answer was lost: what the database says happened.

    The record was the transaction's last write, made under the job row's
    lock. A fenced heartbeat waits for that lock (the server ends a lost
    transaction after ``orphan_limit()``), so once it answers the lost
    transaction is over; then the record is there (committed, with the
    step's writes) or not (neither is). Tried for up to three leases.
    """
    logger.warning("%s %s: the commit of step %r was not acknowledged; recovering its outcome "
                   "from the database", context.job_name, context.job_id, name)
    lease = float(get_settings().LEASE_SECONDS)

    def decide() -> Lookup | None:
        if not claims_for(alias).heartbeat(fence, lease, lock_wait()):
            return None
        return store.get(fence, name)

    found = retrying(decide, time.monotonic() + 3 * lease, threading.Event())
    if found is not None and found.recorded:
        return recorded
    if found is None:
        raise StepNotRecorded("the commit of this atomic step was lost, and the claim is gone "
                              "or the database did not answer: its outcome is left to the "
                              "job's next attempt, which finds the record or runs the step")
    raise StepNotRecorded("the commit of this atomic step was lost, and the database shows it "
                          "did not happen: none of its writes were kept")


async def arun_step(context: "JobContext", name: Any, fn: Callable[..., Any],
                    args: tuple[Any, ...], kwargs: dict[str, Any], atomic: bool) -> Any:
    """``await current_job().astep(...)``: ``run_step`` in a thread, ``fn`` plain or async.

    An ``async def`` ``fn`` runs in that thread through ``async_to_sync``, so
    its ORM calls (``sync_to_async``) come back to the thread's connection --
    the one the step's transaction is on. Inside an atomic job's transaction
    the thread is the job's own (thread-sensitive), else one of its own.
    """
    import inspect

    from asgiref.sync import async_to_sync, sync_to_async

    call: Callable[..., Any] = async_to_sync(fn) if inspect.iscoroutinefunction(fn) else fn
    alias = context._using
    inside = alias is not None and connections[alias].in_atomic_block
    return await sync_to_async(run_step, thread_sensitive=inside)(
        context, name, call, args, kwargs, atomic)
