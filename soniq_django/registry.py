"""``@job`` handlers and the in-process registry of them.

``@job(name="billing.send_invoice", queue="billing", retries=3)`` turns a
function into a :class:`JobHandler`: still callable directly, and able to
enqueue itself now (``.enqueue``, or ``await .aenqueue`` from async code),
when the transaction commits (``.enqueue_on_commit``) or with per-call
options (``.configure``).

``JobHandler`` is generic in the function's parameters (a ``ParamSpec``):
a type checker checks the arguments of ``.enqueue``/``.aenqueue`` against
the function's signature, and calling the handler keeps its return type.

Handlers are found by importing the modules that define them: every
installed app's ``jobs`` and ``tasks`` modules and each module
``SONIQ["IMPORTS"]`` names (``discover``, run by ``SoniqConfig.ready()`` and
again by ``soniq_worker``).
"""

import dataclasses
import functools
import importlib
import inspect
import math
import numbers
import uuid
import warnings
from collections.abc import Awaitable, Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from django.core.exceptions import ImproperlyConfigured

from . import tracing
from .conf import checked, get_settings
from .errors import ConfigValidationError, ErrorCode
from .keys.options import KeyOptions, KeySource, handler_options, key_of
from .producer.request import JobRequest, prepare, prepare_to_insert

_registry: dict[str, "JobHandler[..., Any]"] = {}
_resolvers: list[Callable[[str], Any]] = []
_UNSET: Any = object()
P = ParamSpec("P")
R = TypeVar("R")


def get_handler(job_name: str) -> "JobHandler[..., Any] | None":
    """The handler for ``job_name`` in this process, or None.

    A ``@job`` handler wins; otherwise each resolver added with
    ``register_resolver`` is asked in turn (the Django Tasks backend adds one).
    """
    handler = _registry.get(job_name)
    if handler is not None:
        return handler
    for resolver in _resolvers:
        resolved: JobHandler[..., Any] | None = resolver(job_name)
        if resolved is not None:
            return resolved
    return None


def register_resolver(resolver: Callable[[str], Any]) -> None:
    """Let ``get_handler`` ask ``resolver(job_name)`` for names no ``@job`` handler has.

    The resolver returns a handler-like object (``name``, ``func``,
    ``signature``, ``is_async``, ``max_attempts``, ``queue``, ``unique``,
    optionally ``atomic``, ``timeout`` and ``timeout_origin``) or None.
    Adding the same resolver twice keeps one.
    """
    if resolver not in _resolvers:
        _resolvers.append(resolver)


#: The module names looked for in every installed app: ``jobs`` (soniq's own habit) and
#: ``tasks`` (Celery's and Django Tasks'), so a ``@job`` in either is found.
APP_MODULES = ("jobs", "tasks")

#: Where handlers come from, as the worker's lines about an unknown job name say it.
WHERE_HANDLERS_COME_FROM = ("handlers are imported from each installed app's jobs.py and "
                            "tasks.py and from the modules SONIQ['IMPORTS'] names")


def discover() -> list[tuple[str, str]]:
    """Import every installed app's ``jobs`` and ``tasks`` modules, then ``SONIQ["IMPORTS"]``.

    Returns ``(module, exception class name)`` for each ``IMPORTS`` module
    that could not be imported, and raises nothing for them: the system
    check soniq.E009 names them and ``soniq_worker`` refuses to start. (A
    broken ``jobs`` or ``tasks`` module raises, as Django's admin
    autodiscovery does.) Importing again is cheap: a module already
    imported is not run twice.
    """
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules(*APP_MODULES)
    return import_modules(configured_imports())


def configured_imports() -> list[str]:
    """The module names ``SONIQ["IMPORTS"]`` lists (none when it is not a list of strings)."""
    names = get_settings().IMPORTS
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        return []  # soniq.E003 reports the setting
    return list(names)


def import_modules(names: list[str]) -> list[tuple[str, str]]:
    """Import each module of ``names``; ``(module, exception class name)`` for each that failed."""
    failed = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:  # reported by name; the traceback is one import away
            failed.append((name, type(error).__name__))
    return failed


def registered_handlers() -> dict[str, "JobHandler[..., Any]"]:
    """A copy of the registry: job name → handler."""
    return dict(_registry)


def positive_seconds(value: object) -> bool:
    """Whether ``value`` can be a time limit: a finite number above 0 (a bool is no number)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    seconds = float(value)
    return math.isfinite(seconds) and seconds > 0


def _register(handler: "JobHandler[..., Any]") -> None:
    current = _registry.get(handler.name)
    if current is not None and _origin(current.func) != _origin(handler.func):
        raise ImproperlyConfigured(
            f"Two handlers use the job name {handler.name!r}: "
            f"{_origin(current.func)} and {_origin(handler.func)}."
        )
    _registry[handler.name] = handler


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


@dataclasses.dataclass(frozen=True)
class _Options:
    queue: str | None = None
    priority: int | None = None
    run_at: Any = None
    max_attempts: Any = _UNSET
    unique_job: bool | None = None
    dedup_key: str | None = None
    producer_id: str | None = None
    job_id: Any = None
    using: str | None = None
    delay: Any = None
    depends_on: Any = None


_OPTION_NAMES = frozenset(f.name for f in dataclasses.fields(_Options))


class JobHandler(Generic[P, R]):
    """A function registered as a job. Call it to run it here and now."""

    __qualname__: str  # the function's, as update_wrapper() copies it (with __doc__ and more)

    def __init__(self, func: Callable[P, R], *, name: str, queue: str | None,
                 retries: int | None, unique: bool, atomic: bool = False,
                 timeout: float | None = None, keys: "KeyOptions | None" = None):
        self.keys = keys
        """Its limits per key (``@job(concurrency_key=...)``), checked; None: none."""
        self.func = func
        self.name = name
        self.queue = queue
        self.retries = retries
        self.unique = unique
        self.atomic = atomic
        """Its writes on the jobs database commit with its fenced completion, or not at all."""
        self.timeout = timeout
        """Seconds a run of it may take (``@job(timeout=...)``); None: ``JOB_TIMEOUT_SECONDS``."""
        self.signature = inspect.signature(func)
        self.is_async = inspect.iscoroutinefunction(func)
        functools.update_wrapper(self, func)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.func(*args, **kwargs)

    @functools.cached_property
    def defaults(self) -> dict[str, Any]:
        """The function's keyword defaults, by argument name (a key may come from one)."""
        return {name: p.default for name, p in self.signature.parameters.items()
                if p.default is not inspect.Parameter.empty}

    def __repr__(self) -> str:
        return f"<JobHandler {self.name}>"

    @property
    def max_attempts(self) -> int:
        """Attempts a job of this handler gets: ``retries + 1`` (else ``DEFAULT_MAX_ATTEMPTS``).

        Raises ``SettingsInvalid`` when that setting is needed and the checks reject it.
        """
        if self.retries is None:
            default: int = checked("DEFAULT_MAX_ATTEMPTS")
            return default
        return self.retries + 1

    def configure(self, **options: Any) -> "ConfiguredJob[P]":
        """Return an enqueuer with per-call options (``run_at``, ``delay``, ``priority``, …).

        ``run_at`` is an aware datetime or a ``timedelta`` from now; ``delay``
        (seconds or a ``timedelta``) is the same countdown by another name.
        """
        return ConfiguredJob(self, _Options()).configure(**options)

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> uuid.UUID:
        """Insert the job now, inside the caller's transaction; return its id.

        Raises ``SoniqError(ASYNC_CONTEXT)`` while an event loop runs: await
        ``aenqueue`` there.
        """
        return ConfiguredJob(self, _Options())._enqueue(args, kwargs, stacklevel=3)

    def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[uuid.UUID]:
        """Async twin of ``enqueue``: await it for the job id (arguments checked at the call)."""
        return ConfiguredJob(self, _Options()).aenqueue(*args, **kwargs)

    def enqueue_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> uuid.UUID:
        """Insert the job once the caller's transactions commit; return its id now."""
        return ConfiguredJob(self, _Options()).enqueue_on_commit(*args, **kwargs)

    def bind_kwargs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Map a call's arguments to the keyword arguments stored in the job row.

        Raises ``ConfigValidationError(TASK_ARGS_INVALID)`` when they do not fit the
        function's signature or cannot be passed by keyword.
        """
        bound = bind_or_refuse(self.signature, args, kwargs, f"job {self.name}")
        stored: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self.signature.parameters[name].kind
            if kind is inspect.Parameter.VAR_KEYWORD:
                stored.update(value)
            elif kind is inspect.Parameter.VAR_POSITIONAL:
                if value:
                    raise ConfigValidationError(
                        f"extra positional arguments (*{name}) of job {self.name}: a job row "
                        "carries keyword arguments only",
                        code=ErrorCode.TASK_ARGS_INVALID,
                    )
            elif kind is inspect.Parameter.POSITIONAL_ONLY:
                raise ConfigValidationError(
                    f"argument {name!r} of job {self.name} is positional-only: a job row carries "
                    "keyword arguments only",
                    code=ErrorCode.TASK_ARGS_INVALID,
                )
            else:
                stored[name] = value
        return stored


def bind_or_refuse(signature: Any, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any],
                   what: str) -> inspect.BoundArguments:
    """``signature.bind(*args, **kwargs)``, or ``ConfigValidationError(TASK_ARGS_INVALID)``.

    The message says what does not fit -- the argument missing, unexpected or
    given twice, by name, as ``inspect`` words it (never a value) -- and
    then ``what`` (``"job billing.send_invoice"``).
    """
    try:
        bound: inspect.BoundArguments = signature.bind(*args, **kwargs)
        return bound
    except TypeError as error:
        raise ConfigValidationError(f"{error} ({what})", code=ErrorCode.TASK_ARGS_INVALID
                                    ) from None


class ConfiguredJob(Generic[P]):
    """A handler plus per-call options; made by ``JobHandler.configure``."""

    def __init__(self, handler: "JobHandler[P, Any]", options: _Options):
        self.handler = handler
        self.options = options

    def configure(self, **options: Any) -> "ConfiguredJob[P]":
        """These options on top of the ones set before; a later value wins.

        ``run_at`` and ``delay`` are one option spelt two ways: setting one
        clears the other, and giving both in one call raises
        ``ConfigValidationError(INVALID_OPTION)``. An unknown option name
        raises ``TypeError``; values are checked when the job is enqueued.
        ``atomic`` and ``timeout`` are not options of one enqueue but the
        handler's (``@job(atomic=True, timeout=60)``): they raise ``TypeError`` too.
        """
        for own, spelt in (("atomic", "atomic=True"), ("timeout", "timeout=seconds")):
            if own in options:  # how the worker runs the handler, not a property of one job
                raise TypeError(f"configure() got {own}: a job row cannot carry it; it is the "
                                f"handler's, @job({spelt})")
        unknown = set(options) - _OPTION_NAMES
        if unknown:
            raise TypeError(f"configure() got unknown options: {', '.join(sorted(unknown))}")
        if options.get("run_at") is not None and options.get("delay") is not None:
            raise ConfigValidationError("configure() got run_at and delay: give one of them",
                                        code=ErrorCode.INVALID_OPTION)
        if options.get("run_at") is not None:
            options.setdefault("delay", None)
        elif options.get("delay") is not None:
            options.setdefault("run_at", None)
        return ConfiguredJob(self.handler, dataclasses.replace(self.options, **options))

    def request(self, *args: P.args, **kwargs: P.kwargs) -> JobRequest:
        """The ``JobRequest`` this call would enqueue (arguments checked against the signature)."""
        handler, opts = self.handler, self.options
        max_attempts = handler.max_attempts if opts.max_attempts is _UNSET else (
            opts.max_attempts
        )
        stored = handler.bind_kwargs(args, kwargs)
        key = None if handler.keys is None else key_of(
            handler.keys, handler.name, stored, handler.defaults)
        return JobRequest(
            handler.name,
            stored,
            queue=opts.queue if opts.queue is not None else handler.queue,
            priority=opts.priority,
            run_at=opts.run_at,
            max_attempts=max_attempts,
            unique_job=handler.unique if opts.unique_job is None else opts.unique_job,
            dedup_key=opts.dedup_key,
            producer_id=opts.producer_id,
            job_id=opts.job_id,
            delay=opts.delay,
            depends_on=opts.depends_on,
            concurrency_key=None if key is None else key.key,
            key_concurrency=None if key is None else key.concurrency,
            key_rate=None if key is None else key.rate,
        )

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> uuid.UUID:
        """Insert the job now, inside the caller's transaction; return its id.

        Warns (``RuntimeWarning``) when jobs live on another database alias
        than the one whose transaction is open: the job then commits at once.
        Raises ``SoniqError(ASYNC_CONTEXT)`` while an event loop runs.
        """
        return self._enqueue(args, kwargs, stacklevel=3)

    def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[uuid.UUID]:
        """Async twin of ``enqueue``: await it for the job id.

        The arguments are checked and copied at the call, before the thread
        hop: ``ConfigValidationError`` is raised there.
        """
        from .producer.aio import insert_async
        from .producer.api import write_alias

        return insert_async(prepare_to_insert(self.request(*args, **kwargs)),
                            write_alias(self.options.using))

    def _enqueue(self, args: tuple[Any, ...], kwargs: dict[str, Any], stacklevel: int
                 ) -> uuid.UUID:
        from .producer.api import insert_prepared, refuse_event_loop, write_alias
        from .producer.commit import warn_if_uncoupled

        refuse_event_loop("enqueue", "aenqueue")
        prepared = prepare_to_insert(self.request(*args, **kwargs))
        alias = write_alias(self.options.using)
        warn_if_uncoupled(alias, stacklevel=stacklevel)
        return insert_prepared(prepared, alias)

    def enqueue_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> uuid.UUID:
        """Validate now; insert once the caller's transactions commit; return the job id.

        The insert waits for every database alias with an ``atomic()`` block
        open now (the jobs alias or any other: see ``producer/commit.py``); if
        one of them rolls back, no job exists. Outside any transaction the job
        is inserted at once. The insert is a transaction of its own, after
        the caller's commits. For a unique or dedup job the id returned is
        the one the new row would get: if an equal job is still queued at
        commit, no row is inserted and that job runs instead. Raises
        ``SoniqError(ASYNC_CONTEXT)`` while an event loop runs (an async view
        has no transaction to wait for: await ``aenqueue``).
        """
        from .producer.api import insert_prepared, refuse_event_loop, write_alias
        from .producer.commit import after_commit

        refuse_event_loop("enqueue_on_commit", "aenqueue")
        prepared = prepare(self.request(*args, **kwargs))
        alias = write_alias(self.options.using)
        # The insert runs after the commit, under the trace context current now (tracing.py).
        after_commit(tracing.bound(lambda: insert_prepared(prepared, alias)), alias)
        return prepared.job_id


@overload
def job(func: Callable[P, R], /) -> JobHandler[P, R]: ...


@overload
def job(func: None = None, /, *, name: str | None = None, queue: str | None = None,
        retries: int | None = None, unique: bool = False, atomic: bool = False,
        timeout: float | None = None, concurrency_key: "KeySource | None" = None,
        key_concurrency: int | None = None, key_rate: str | None = None
        ) -> Callable[[Callable[P, R]], JobHandler[P, R]]: ...


def job(func: Callable[..., Any] | None = None, *, name: str | None = None,
        queue: str | None = None, retries: int | None = None, unique: bool = False,
        atomic: bool = False, timeout: float | None = None,
        concurrency_key: "KeySource | None" = None, key_concurrency: int | None = None,
        key_rate: str | None = None) -> Any:
    """Register a function as a job handler; usable as ``@job``, ``@job()`` or ``@job(name=...)``.

    Without ``name=`` the job name is derived from ``module.function`` and a
    ``DeprecationWarning`` prints it: other languages cannot know a Python
    import path, so name jobs on purpose.

    ``atomic=True``: the worker runs the handler inside a transaction on the
    jobs database and writes the job's fenced completion in that same
    transaction, so the handler's writes there commit together with the
    completion or not at all (docs/exactly-once.md). ``async def`` handlers
    may be atomic too.

    ``timeout=seconds`` (a positive number): a run of this job may take that
    long, counted from its claim, instead of ``SONIQ["JOB_TIMEOUT_SECONDS"]``
    (longer or shorter); None, the default, leaves the setting in force. At
    the deadline the worker fails the run (retried while attempts remain,
    docs/worker.md#cancelling-and-timeouts).

    ``concurrency_key`` (an argument name, or a callable of the job's keyword
    arguments returning a string), ``key_concurrency=N``, ``key_rate="N/s"``:
    at most N jobs with the same key run at once across all workers, at most
    N start in any window (docs/keys.md). The key is computed at enqueue.
    Bad values raise ``ImproperlyConfigured``.
    """
    if retries is not None and (type(retries) is not int or retries < 0):
        raise ImproperlyConfigured("@job(retries=...) must be a whole number of 0 or more")
    if type(atomic) is not bool:
        raise ImproperlyConfigured("@job(atomic=...) must be True or False")
    if timeout is not None and not positive_seconds(timeout):
        got = (repr(timeout) if isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
               else f"a value of type {type(timeout).__name__}")
        raise ImproperlyConfigured(
            f"@job(timeout=...) must be a positive, finite number of seconds, or None for "
            f"SONIQ['JOB_TIMEOUT_SECONDS'] (got {got})")

    def decorate(function: Callable[..., Any], stacklevel: int = 2) -> JobHandler[..., Any]:
        job_name = name
        if job_name is None:
            job_name = f"{function.__module__}.{function.__name__}"
            warnings.warn(
                f"@job without name= derives the job name {job_name!r} from the import path; "
                f"this is deprecated. Write @job(name={job_name!r}) to keep queued jobs running.",
                DeprecationWarning,
                stacklevel=stacklevel,
            )
        keys = handler_options(function, concurrency_key, key_concurrency, key_rate)
        handler = JobHandler(function, name=job_name, queue=queue, retries=retries, unique=unique,
                             atomic=atomic, timeout=timeout, keys=keys)
        _register(handler)
        return handler

    if func is not None:
        return decorate(func, stacklevel=3)
    return decorate
