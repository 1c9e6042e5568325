"""The worker's own row in soniq_workers, and the task registry it publishes.

Both tables are Soniq's own, column for column (docs/storage-format.md), so
a soniq_django worker and a Soniq worker register side by side and each can
read the other's rows. As in Soniq, a process has one row: ``(hostname,
pid)`` is unique. A new worker in a process that already has a row (a
restarted container whose worker is pid 1 again, or a second ``Worker`` in
the same process) takes the place of the old one: the old row goes, and the
jobs that named it keep their history but no longer point at it
(``worker_id`` becomes NULL, as Soniq's ``ON DELETE SET NULL`` foreign key
would do). That keeps every ``soniq_jobs.worker_id`` naming an existing row,
so Soniq's foreign key can always be added.

Its times (``started_at``, ``last_heartbeat``, the registry's
``last_seen_at``) are the database's (``overview.database_time``), never
this host's: other workers judge its liveness by the database's clock, so a
host whose clock is off is not taken for dead (or for alive once silent).

On PostgreSQL the row, the names and the heartbeat are written by the SQL
functions every worker calls, whatever its language (soniq_register_worker
and soniq_worker_heartbeat, sql/worker_registry_v1.sql): one rule makes a
worker live, a Python one or a foreign one. On SQLite, which has no SQL API,
the functions below are their twins.
"""

import inspect
import os
import socket
import typing
import uuid
from functools import cache
from importlib import metadata
from typing import Any

from django.db import IntegrityError, connections, transaction

from ..models import Job, TaskRegistration, Worker, WorkerState
from ..overview import database_time
from ..owned._store import fenced_writes
from ..registry import registered_handlers

STATES = {
    "running": WorkerState.ACTIVE,  # what the worker loop says while it claims
    WorkerState.ACTIVE: WorkerState.ACTIVE,
    WorkerState.STOPPING: WorkerState.STOPPING,
    WorkerState.STOPPED: WorkerState.STOPPED,
}
"""The worker loop's words for its state, as soniq_workers.status values (Soniq's)."""


@cache
def implementation() -> str:
    """What soniq_django's workers write in ``soniq_workers.version``: ``soniq_django <ver>``."""
    try:
        return f"soniq_django {metadata.version('soniq-django')}"
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "soniq_django"


def register(using: str, worker_id: str, queues: list[str] | None, concurrency: int) -> None:
    """Insert (or revive) this worker's row as active, with this process's handlers' names.

    The row of an older worker of this process is replaced (``register_worker``).
    """
    handlers = sorted(registered_handlers().items())
    register_worker(
        using, worker_id, queues, [name for name, _ in handlers],
        host=socket.gethostname()[:255], pid=os.getpid(), label=implementation(),
        max_attempts=[handler.max_attempts for _, handler in handlers], concurrency=concurrency)


def register_worker(using: str, worker_id: str, queues: list[str] | None, job_names: list[str],
                    *, host: str, pid: int, label: str | None,
                    max_attempts: list[int | None] | None = None, concurrency: int = 1) -> None:
    """``soniq_register_worker``: the worker's row, active, and exactly ``job_names`` registered.

    ``max_attempts[i]`` is the attempt limit of ``job_names[i]`` for jobs
    whose own is NULL. On PostgreSQL the SQL function (the one every
    worker calls); on SQLite its twin. Raises IntegrityError when three
    tries in a row met a concurrent registration of the same host and pid.
    """
    if connections[using].vendor == "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute(
                "SELECT soniq_register_worker(%s, %s::text[], %s::text[], %s, %s, %s, "
                "%s::integer[], %s)",
                [uuid.UUID(worker_id), list(queues or []), job_names, host, pid, label,
                 max_attempts, concurrency])
        return
    wid = uuid.UUID(worker_id)
    limits = max_attempts or [None] * len(job_names)
    for attempt in range(3):
        try:
            with transaction.atomic(using=using):
                older = list(
                    Worker.objects.using(using).select_for_update()
                    .filter(hostname=host, pid=pid).exclude(id=wid)
                    .values_list("id", flat=True)
                )
                if older:
                    _release(using, older)
                now = database_time(using)
                Worker.objects.using(using).update_or_create(id=wid, defaults={
                    "hostname": host, "pid": pid, "queues": list(queues or []),
                    "concurrency": concurrency, "status": WorkerState.ACTIVE,
                    "started_at": now, "last_heartbeat": now, "version": label,
                })
                names = TaskRegistration.objects.using(using).filter(worker_id=str(wid))
                names.exclude(task_name__in=job_names).delete()
                TaskRegistration.objects.using(using).bulk_create(
                    [TaskRegistration(task_name=name, worker_id=str(wid), last_seen_at=now,
                                      max_attempts=limit)
                     for name, limit in zip(job_names, limits)],
                    update_conflicts=True, unique_fields=["task_name", "worker_id"],
                    update_fields=["last_seen_at", "max_attempts"])
            return
        except IntegrityError:
            # Another worker of this process registered between our look and
            # our insert; look again.
            if attempt == 2:
                raise


def _release(using: str, worker_ids: list[uuid.UUID]) -> None:
    """Delete the rows of earlier workers, first pointing their jobs' worker_id at nothing.

    On PostgreSQL the protection trigger of migration 0004 skips writes to
    owned rows that do not come through the claim functions; this write
    touches only the informational ``worker_id``, so it opens the same gate.
    """
    with fenced_writes(connections[using]):
        Job.objects.using(using).filter(worker_id__in=worker_ids).update(worker_id=None)
    TaskRegistration.objects.using(using).filter(
        worker_id__in=[str(worker_id) for worker_id in worker_ids]).delete()
    Worker.objects.using(using).filter(id__in=worker_ids).delete()


def beat(using: str, worker_id: str, state: str = WorkerState.ACTIVE) -> bool:
    """Record that the worker is alive (and whether it is draining).

    False when it has no row, or a stopped one: it must register again.
    """
    status = STATES[state]
    if connections[using].vendor == "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT soniq_worker_heartbeat(%s, %s)", [uuid.UUID(worker_id), status])
            written: bool = cursor.fetchone()[0]
        return written
    return bool(Worker.objects.using(using).filter(id=uuid.UUID(worker_id)).exclude(
        status=WorkerState.STOPPED).update(last_heartbeat=database_time(using), status=status))


def unregister(using: str, worker_id: str) -> None:
    """Mark the worker stopped; its last heartbeat is when it stopped (as in Soniq)."""
    beat(using, worker_id, WorkerState.STOPPED)


def publish_registry(using: str, worker_id: str) -> None:
    """Write one soniq_task_registry row per handler this process knows, for this worker.

    ``register`` wrote the names and attempt limits (as any worker's
    registration does); this adds what only soniq_django knows: each
    handler's signature, queue and uniqueness.
    """
    now = database_time(using)
    rows = [
        TaskRegistration(
            task_name=name, worker_id=str(worker_id), last_seen_at=now,
            args_model_repr=f"{handler.__qualname__}{signature_text(handler.signature)}"[:2000],
            queue=handler.queue or "default", max_attempts=handler.max_attempts,
            unique_job=handler.unique,
        )
        for name, handler in sorted(registered_handlers().items())
    ]
    TaskRegistration.objects.using(using).bulk_create(
        rows, update_conflicts=True, unique_fields=["task_name", "worker_id"],
        update_fields=["last_seen_at", "args_model_repr", "queue", "max_attempts", "unique_job"],
    )


class _Default:
    """Stands for a parameter's default value in ``signature_text``: shown as "…"."""

    def __repr__(self) -> str:
        return "…"


def _annotation(annotation: Any) -> Any:
    """An annotation without ``Annotated``'s extra values (they may hold anything)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return typing.get_args(annotation)[0]
    return annotation


def signature_text(signature: Any) -> str:
    """A handler's parameters as soniq_task_registry stores them (``args_model_repr``).

    Names, kinds (``*``, ``/``, ``**``) and type annotations; a default is
    written ``=…``, never its value: ``def send(to: str, api_key=settings.KEY)``
    is stored as ``(to: str, api_key=…)``, so no admin page shows a key a
    handler takes by default. A Django task's signature is its function's.
    """
    function = getattr(signature, "function", signature)
    if not isinstance(function, inspect.Signature):
        return "(…)"
    parameters = [
        parameter.replace(
            default=_Default() if parameter.default is not parameter.empty else parameter.empty,
            annotation=_annotation(parameter.annotation))
        for parameter in function.parameters.values()
    ]
    return str(function.replace(parameters=parameters,
                                return_annotation=_annotation(function.return_annotation)))
