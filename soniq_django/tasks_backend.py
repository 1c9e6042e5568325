"""A Django Tasks backend that stores each task call as a soniq job.

``TASKS = {"default": {"BACKEND": "soniq_django.tasks_backend.SoniqTaskBackend"}}``
makes ``@task`` functions enqueue rows in ``soniq_jobs`` that ``soniq_worker``
runs. Works against Django 6's ``django.tasks`` and, before Django 6, the
``django-tasks`` backport. See docs/django-tasks.md.

A call is stored as the job args ``{"args": [...], "kwargs": {...}}`` (format 1
wants an object), under the job name ``task.module_path``. The worker finds
the task again through ``find_task_handler``, which only ever returns an object
that *is* a Task of this backend: a row cannot name an arbitrary function.
"""

import builtins
import dataclasses
import datetime as dt
import importlib
import inspect
import logging
import re
import sys
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections, router
from django.utils import timezone

from . import tracing
from .conf import checked, get_settings
from .errors import ConfigValidationError, SettingsInvalid, SoniqError

if TYPE_CHECKING:
    from .keys.options import JobKey, KeyOptions

try:  # Django 6: its own django.tasks, even where the backport is installed too
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django.tasks.exceptions import InvalidTask as InvalidTaskError
    from django.tasks.exceptions import TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued

    TASKS_API = "django.tasks"
except ImportError:  # before Django 6: the django-tasks backport
    from django_tasks import task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskContext, TaskError, TaskResult, TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError, TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued

    TASKS_API = "django_tasks"
"""The package of the Tasks API in use: ``"django.tasks"`` or ``"django_tasks"`` (the backport)."""

logger = logging.getLogger("soniq_django.tasks")

PRIORITY_PIVOT = 100
"""soniq priority = PRIORITY_PIVOT - Django priority: Django 0 is soniq's default 100."""

_OPTIONS = frozenset({"atomic", "database", "enqueue_on_commit", "max_attempts", "timeout",
                      "concurrency_key", "key_concurrency", "key_rate"})

_STATUSES = {
    "queued": TaskResultStatus.READY,
    "processing": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "cancelled": TaskResultStatus.FAILED,
    "dead_letter": TaskResultStatus.FAILED,
}

# The header line of the last exception in a formatted traceback: "pkg.Error: message".
_EXCEPTION_HEADER = re.compile(r"([A-Za-z_][\w.]*)(?::|$)")


def soniq_priority(django_priority: int) -> int:
    """Django's -100..100 (higher runs first) as soniq's 0..200 (lower runs first)."""
    return PRIORITY_PIVOT - django_priority


class SoniqTaskBackend(BaseTaskBackend):
    """Enqueue Django tasks as soniq jobs; ``manage.py soniq_worker`` runs them.

    ``OPTIONS``: ``database`` (alias; default: the routers' choice for jobs),
    ``enqueue_on_commit`` (default False: insert inside the caller's
    transaction), ``max_attempts`` (default: ``SONIQ["DEFAULT_MAX_ATTEMPTS"]``)
    ``atomic`` (default False: True runs every task of this backend as
    ``@job(atomic=True)`` runs its handler; docs/exactly-once.md) and
    ``timeout`` (seconds; default None: ``SONIQ["JOB_TIMEOUT_SECONDS"]``), the
    time limit of every task of this backend, as ``@job(timeout=...)`` sets
    one handler's -- the Tasks API has no per-task timeout. ``concurrency_key``
    (the name of an argument of the tasks), ``key_concurrency`` and ``key_rate``:
    limits per key for every task of this backend, as ``@job(...)`` sets them for
    one handler (docs/keys.md) -- a Task carries no options of its own, so a
    backend per limit: ``@task(backend="per_tenant")``.
    """

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = self.options
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys: {', '.join(sorted(unknown))}; "
                f"SoniqTaskBackend knows {', '.join(sorted(_OPTIONS))}."
            )
        self.database = options.get("database")
        if self.database is not None and self.database not in settings.DATABASES:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['database'] names no entry of DATABASES."
            )
        self.enqueue_on_commit = options.get("enqueue_on_commit", False)
        if type(self.enqueue_on_commit) is not bool:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['enqueue_on_commit'] must be True or False."
            )
        self.atomic = options.get("atomic", False)
        if type(self.atomic) is not bool:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['atomic'] must be True or False."
            )
        from .registry import positive_seconds

        self.timeout: float | None = options.get("timeout")
        if self.timeout is not None and not positive_seconds(self.timeout):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['timeout'] must be a positive, finite number of "
                f"seconds, or None for SONIQ['JOB_TIMEOUT_SECONDS']."
            )
        self._max_attempts: int | None = options.get("max_attempts")
        if self._max_attempts is not None and (
            type(self._max_attempts) is not int or self._max_attempts < 1
        ):
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']['max_attempts'] must be a whole number of 1 or more."
            )
        self.key_options = _key_options(alias, options)

    @property
    def max_attempts(self) -> int:
        """Attempts each task gets before it fails for good."""
        if self._max_attempts is None:
            default: int = checked("DEFAULT_MAX_ATTEMPTS")
            return default
        return self._max_attempts

    def validate_task(self, task: Task) -> None:
        """Django's rules, plus: the task's module path must be a valid soniq job name.

        ``run_after`` may also be a ``timedelta`` (a countdown, which Django's
        own check refuses): ``task.using(run_after=timedelta(minutes=5))``
        runs the task five minutes after it is enqueued, by the database's clock.
        """
        if isinstance(task.run_after, dt.timedelta):
            from .producer.request import schedule

            try:
                schedule(task.run_after, None)
            except SoniqError as error:
                raise InvalidTaskError(error.reason.replace("run_at", "run_after")) from None
            # Django's checks of everything else (and USE_TZ's of a datetime).
            task = dataclasses.replace(task, run_after=None)
        super().validate_task(task)
        if "." in task.func.__qualname__:
            raise InvalidTaskError("Task function must be defined at a module level.")
        from .producer.request import validate_job_name

        try:
            validate_job_name(task.module_path)
        except SettingsInvalid:
            # A bad TASK_NAME_PATTERN is soniq.E004's to report (manage.py
            # check), not an import error of every module with a @task:
            # enqueue() refuses with it until it is fixed.
            return
        except SoniqError:
            raise InvalidTaskError(
                f"The task {task.module_path!r} cannot be stored as a soniq job: its module path "
                f"is the job name, which must match SONIQ['TASK_NAME_PATTERN'] "
                f"({get_settings().TASK_NAME_PATTERN}). Rename the module or function "
                f"(lowercase letters, digits and underscores, joined by dots)."
            ) from None

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Insert a job for this call and return its ``TaskResult`` (status READY).

        With ``enqueue_on_commit`` the row is inserted once every transaction
        open now has committed (at once outside one; never if one rolls back)
        and the returned id is the id it will get; without it, an insert that
        cannot follow the caller's transaction (open on another database
        alias only) warns, as ``enqueue()`` does. Raises ``InvalidTaskError``
        for an invalid task and ``ConfigValidationError(TASK_ARGS_INVALID)``
        when the arguments do not fit the function or are not JSON; nothing
        is written then. ``aenqueue``
        (inherited) is its async twin.
        """
        from .producer.api import insert_prepared, write_alias
        from .producer.commit import after_commit, warn_if_uncoupled
        from .producer.request import JobRequest, prepare

        self.validate_task(task)
        args, kwargs = list(args), dict(kwargs)
        _check_call(task, args, kwargs)
        key = _key_of(self.key_options, task, args, kwargs)
        prepared = prepare(JobRequest(
            task.module_path,
            {"args": args, "kwargs": kwargs},
            queue=task.queue_name,
            priority=soniq_priority(task.priority),
            run_at=task.run_after,
            max_attempts=self.max_attempts,
            concurrency_key=None if key is None else key.key,
            key_concurrency=None if key is None else key.concurrency,
            key_rate=None if key is None else key.rate,
        ))
        alias = write_alias(self.database)
        result = TaskResult(
            task=task, id=str(prepared.job_id), status=TaskResultStatus.READY,
            enqueued_at=None, started_at=None, finished_at=None, last_attempted_at=None,
            args=args, kwargs=kwargs, backend=self.alias, errors=[], worker_ids=[],
        )

        def insert() -> None:
            insert_prepared(prepared, alias)
            object.__setattr__(result, "enqueued_at", timezone.now())
            task_enqueued.send(type(self), task_result=result)

        if self.enqueue_on_commit:
            after_commit(tracing.bound(insert), alias)  # the trace context current now
        else:
            # backend.enqueue <- Task.enqueue <- the caller
            warn_if_uncoupled(alias, stacklevel=3)
            insert()
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task result stored under ``result_id`` (a job id).

        Raises ``TaskResultDoesNotExist`` when no such job exists, its result
        has expired, or the job is not a task of a SoniqTaskBackend.
        ``aget_result`` (inherited) is its async twin.
        """
        from .producer import get_job

        try:
            info = get_job(result_id, using=self.database)
        except ConfigValidationError:
            raise TaskResultDoesNotExist("a task result id is a job id (a UUID)") from None
        task = find_task(info.job_name) if info is not None else None
        # A task is found only for a job that exists (info is not None then).
        row = (_stored_row(info.id, self.database)  # type: ignore[union-attr]
               if task is not None else None)
        if row is None:
            raise TaskResultDoesNotExist(
                "no task result has this id: the job is unknown, expired or not a Django task"
            )
        return self._result(info, row, task)

    def wait_for_result(self, result_id: str, *, timeout: float) -> TaskResult:
        """Wait until the task's job is finished (``soniq_django.wait_for_job``); its result.

        The ``TaskResult`` is built from the ``JobInfo`` the wait returned,
        as ``get_result`` builds it from ``get_job``'s: same statuses, errors
        and return value, so a ``refresh()`` on the same database afterwards
        reads the same. Past ``timeout``: ``WaitTimeout`` (code
        WAIT_TIMEOUT). ``TaskResultDoesNotExist`` as ``get_result`` says.
        """
        from .waiting import wait_for_job

        try:
            info = wait_for_job(result_id, timeout=timeout, using=self.database)
        except ConfigValidationError:
            raise TaskResultDoesNotExist("a task result id is a job id (a UUID)") from None
        return self._finished(info)

    async def await_result(self, result_id: str, *, timeout: float) -> TaskResult:
        """Async twin of ``wait_for_result``."""
        from .waiting import await_job

        try:
            waiting = await_job(result_id, timeout=timeout, using=self.database)
        except ConfigValidationError:
            raise TaskResultDoesNotExist("a task result id is a job id (a UUID)") from None
        info = await waiting
        return await sync_to_async(self._finished)(info)

    def _finished(self, info: Any) -> TaskResult:
        task = find_task(info.job_name)
        row = _stored_row(info.id, self.database) if task is not None else None
        if row is None or task is None:
            raise TaskResultDoesNotExist("the job is not a Django task")
        return self._result(info, row, task)

    def _result(self, info: Any, row: dict[str, Any], task: Task) -> TaskResult:
        stored = row["args"] if isinstance(row["args"], dict) else {}
        status = _STATUSES[info.status]
        finished = info.status in ("done", "cancelled", "dead_letter")
        errors = [] if info.last_error is None else [_task_error(info.last_error)]
        if info.status == "cancelled":
            errors.append(TaskError(exception_class_path="soniq_django.errors.JobCancelled",
                                    traceback="The job was cancelled."))
        owner = row.get("owner")
        # Django counts attempts as len(worker_ids); soniq keeps the worker of
        # the latest attempt only, so earlier entries are "" (unknown).
        worker_ids = [""] * info.attempts
        if worker_ids and owner:
            worker_ids[-1] = str(owner)
        result = TaskResult(
            task=_as_enqueued(task, info.queue, row["priority"]),
            id=str(info.id), status=status, enqueued_at=info.created_at, started_at=None,
            finished_at=info.updated_at if finished else None, last_attempted_at=None,
            args=stored.get("args") if isinstance(stored.get("args"), list) else [],
            kwargs=stored.get("kwargs") if isinstance(stored.get("kwargs"), dict) else {},
            backend=self.alias, errors=errors, worker_ids=worker_ids,
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", info.result)
        return result


def _key_options(alias: str, options: dict[str, Any]) -> "KeyOptions | None":
    """``OPTIONS``' limits per key, checked (``ImproperlyConfigured``); None: none."""
    from .keys.options import KeyOptions, checked_limits

    name = options.get("concurrency_key")
    limit, rate = options.get("key_concurrency"), options.get("key_rate")
    where = f"TASKS[{alias!r}]['OPTIONS']"
    if name is None:
        if limit is not None or rate is not None:
            raise ImproperlyConfigured(
                f"{where}['key_concurrency'] and ['key_rate'] need ['concurrency_key']: the "
                f"name of the tasks' argument that gives each task its key.")
        return None
    if type(name) is not str or not name.isidentifier():
        raise ImproperlyConfigured(f"{where}['concurrency_key'] must be an argument name.")
    limit, rate = checked_limits(limit, rate, lambda option: f"{where}[{option!r}]")
    return KeyOptions(name, limit, rate)


def _key_of(options: "KeyOptions | None", task: Task, args: list[Any],
            kwargs: dict[str, Any]) -> "JobKey | None":
    """The key of this call: the argument ``concurrency_key`` names, however it is passed,
    or its default; ``ConfigValidationError(INVALID_OPTION)`` as for a ``@job``'s key (a
    task without that argument, a value that is not a string or an integer)."""
    if options is None:
        return None
    from .keys.options import key_of

    leading = [None] if task.takes_context else []
    bound = inspect.signature(task.func).bind(*leading, *args, **kwargs)
    bound.apply_defaults()
    given = dict(bound.arguments)
    if task.takes_context:
        given.pop(next(iter(given)))  # the context, not an argument of the call
    return key_of(options, task.module_path, given, {})


def _check_call(task: Task, args: list[Any], kwargs: dict[str, Any]) -> None:
    from .registry import bind_or_refuse

    leading = [None] if task.takes_context else []
    bind_or_refuse(inspect.signature(task.func), [*leading, *args], kwargs,
                   f"task {task.module_path}")


def _stored_row(job_id: Any, database: str | None) -> dict[str, Any] | None:
    """The args, priority and last worker of a job (live or dead-lettered)."""
    from .models import DeadLetterJob, Job

    alias = database or router.db_for_read(Job)
    row: dict[str, Any] | None = (Job.objects.using(alias).filter(id=job_id)
                                  .values("args", "priority", "claim_owner", "worker_id").first())
    if row is not None:
        row["owner"] = row["claim_owner"] or row["worker_id"]
        return row
    row = DeadLetterJob.objects.using(alias).filter(id=job_id).values("args", "priority").first()
    return row


def _as_enqueued(task: Task, queue: str, priority: int) -> Task:
    """The task with the queue and priority the job was stored with, when still valid."""
    try:
        return task.using(queue_name=queue, priority=PRIORITY_PIVOT - priority)
    except InvalidTaskError:
        return task


def _task_error(text: str) -> TaskError:
    """A ``TaskError`` for a stored ``last_error``: the last exception's class, the full text."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    path = "builtins.Exception"
    if starts:
        header = next((line for line in lines[starts[-1] + 1:] if line and not line[0].isspace()),
                      "")
        match = _EXCEPTION_HEADER.match(header)
        if match:
            # traceback prints builtins and __main__ classes without a module.
            path = match.group(1)
            if "." not in path:
                path = f"builtins.{path}" if hasattr(builtins, path) else f"__main__.{path}"
    return TaskError(exception_class_path=path, traceback=text)


# The worker side -------------------------------------------------------


def find_task(job_name: str) -> Task | None:
    """The Task of a SoniqTaskBackend stored at the module path ``job_name``, or None.

    Imports only modules already loaded or inside an installed app, and only
    ever returns an object that is a Task whose module path is ``job_name``:
    a job row cannot name a plain function, a class or another module.
    """
    module_name, _, attribute = job_name.rpartition(".")
    if not module_name or not attribute:
        return None
    if module_name not in sys.modules and apps.get_containing_app_config(module_name) is None:
        return None
    try:
        module = importlib.import_module(module_name)
    except Exception:  # a missing or broken module: the job has no handler here
        logger.warning("cannot import %s for job %s", module_name, job_name, exc_info=True)
        return None
    candidate = vars(module).get(attribute)
    if not isinstance(candidate, Task) or candidate.module_path != job_name:
        return None
    try:
        backend = task_backends[candidate.backend]
    except ImproperlyConfigured:  # an alias no longer in TASKS, or a broken backend
        return None
    return candidate if isinstance(backend, SoniqTaskBackend) else None


def find_task_handler(job_name: str) -> "TaskHandler | None":
    """The resolver registered with ``soniq_django.registry``: a handler for a task, or None."""
    task = find_task(job_name)
    return None if task is None else TaskHandler(task)


class TaskSignature:
    """What a task's job args must be: ``{"args": [...], "kwargs": {...}}`` that fit it."""

    def __init__(self, task: Task):
        self.task = task
        self.function = inspect.signature(task.func)

    def bind(self, *extra: Any, **stored: Any) -> inspect.BoundArguments:
        """Bind stored args to the task function; raise ``TypeError`` when they do not fit."""
        if extra or not set(stored) <= {"args", "kwargs"}:
            raise TypeError("a task's job args hold only 'args' (a list) and 'kwargs' (an object)")
        args, kwargs = stored.get("args", []), stored.get("kwargs", {})
        if type(args) is not list or type(kwargs) is not dict:
            raise TypeError("a task's 'args' must be a list and its 'kwargs' an object")
        leading = [None] if self.task.takes_context else []
        return self.function.bind(*leading, *args, **kwargs)

    def __str__(self) -> str:
        return f"(args: list = [], kwargs: dict = {{}}) for {self.function}"


class TaskHandler:
    """A Django task seen as a soniq job handler: ``func(args=[...], kwargs={...})``."""

    unique = False
    retries = None

    def __init__(self, task: Task):
        self.task = task
        self.name = task.module_path
        self.queue = task.queue_name
        self.signature = TaskSignature(task)
        self.is_async = inspect.iscoroutinefunction(task.func)
        self.func = self._arun if self.is_async else self._run
        self.__qualname__ = task.func.__qualname__

    def __repr__(self) -> str:
        return f"<TaskHandler {self.name}>"

    @property
    def max_attempts(self) -> int:
        """Attempts for rows that store no ``max_attempts`` (NULL)."""
        attempts: int = task_backends[self.task.backend].max_attempts
        return attempts

    @property
    def atomic(self) -> bool:
        """Whether the task's backend runs its tasks atomically (``OPTIONS["atomic"]``)."""
        atomic: bool = task_backends[self.task.backend].atomic
        return atomic

    @property
    def timeout(self) -> float | None:
        """The time limit of the task's backend (``OPTIONS["timeout"]``); None: the setting's."""
        timeout: float | None = task_backends[self.task.backend].timeout
        return timeout

    @property
    def timeout_origin(self) -> str:
        """Where that limit is set, as a timed-out task's ``last_error`` names it."""
        return f"TASKS[{self.task.backend!r}]['OPTIONS']['timeout']"

    def _run(self, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None) -> Any:
        leading = [TaskContext(task_result=self._running())] if self.task.takes_context else []
        return self.task.func(*leading, *(args or []), **(kwargs or {}))

    async def _arun(self, args: list[Any] | None = None, kwargs: dict[str, Any] | None = None
                    ) -> Any:
        leading = []
        if self.task.takes_context:
            running = await sync_to_async(self._running_closed, thread_sensitive=False)()
            leading = [TaskContext(task_result=running)]
        return await self.task.func(*leading, *(args or []), **(kwargs or {}))

    def _running(self) -> TaskResult:
        """The running job's ``TaskResult``, read from the database."""
        from .worker import current_job

        job = current_job()
        if job is None:
            raise RuntimeError("a task that takes a context runs only inside soniq_worker")
        return task_backends[self.task.backend].get_result(job.job_id)

    def _running_closed(self) -> TaskResult:
        # Runs in a short-lived executor thread: close its connection after use.
        try:
            return self._running()
        finally:
            connections.close_all()


__all__ = ["TASKS_API", "SoniqTaskBackend", "TaskHandler", "find_task", "find_task_handler",
           "soniq_priority"]
