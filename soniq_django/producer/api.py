"""Enqueue jobs and read them back: the Python twins of ``soniq_enqueue`` and ``soniq_get_job``.

Every function takes ``using=`` (a database alias); without it the project's
database routers pick one, as they do for the ``Job`` model: the write alias
for enqueues, the read alias for ``get_job``. Their async twins
(``aenqueue``, ``abulk_enqueue``, ``aget_job``) are in ``producer/aio.py``.
"""

import asyncio
import dataclasses
import datetime as dt
import os
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from .commit import warn_if_uncoupled
from .. import progress, signals, tracing
from ..errors import ErrorCode, SoniqError, sqlstate, translate, translating
from ..conf import DEFAULT_MAX_ATTEMPTS
from .request import (SERVER_MADE_ID, JobRequest, PreparedJob, coerce_job_id, prepare_all,
                      prepare_to_insert)
from ..models import DeadLetterJob, Job, JobStatus


@dataclass(frozen=True, kw_only=True)
class JobInfo:
    """A job as ``soniq_get_job`` returns it; ``status`` is ``dead_letter`` for dead letters."""

    id: uuid.UUID
    job_name: str
    status: str
    queue: str
    attempts: int
    max_attempts: int | None
    result: Any
    last_error: str | None
    dead_letter_reason: str | None
    scheduled_at: dt.datetime | None
    created_at: dt.datetime | None
    updated_at: dt.datetime | None
    progress: dict[str, Any] | None = None
    """The last progress its handler reported (``current_job().set_progress``): None, or
    ``{"done": int, "total": int | None, "note": str | None, "updated_at": datetime}``;
    kept after the job finished, until its row is purged (docs/workflows.md#progress)."""
    steps: tuple[str, ...] = ()
    """The names of its recorded durable steps (``current_job().step``), in the order they
    were recorded; kept until its row is purged or ``reset_steps`` (docs/steps.md)."""

    @property
    def finished(self) -> bool:
        """Whether the job is over: ``done``, ``cancelled`` or ``dead_letter``."""
        return self.status in FINISHED_STATUSES


#: The statuses of a finished job: what ``wait_for_job`` waits for.
FINISHED_STATUSES = frozenset({"done", "cancelled", "dead_letter"})


#: Called with the jobs alias after each enqueue has inserted its rows (in the
#: caller's transaction). ``soniq_django.testing.immediate()`` adds one to run
#: the jobs at once; nothing else does.
enqueue_listeners: list[Callable[[str], object]] = []


def _enqueued(alias: str) -> None:
    if not enqueue_listeners:
        return
    for listener in list(enqueue_listeners):
        listener(alias)


def refuse_event_loop(what: str, twin: str) -> None:
    """Raise ``SoniqError(ASYNC_CONTEXT)`` naming ``twin`` when an event loop runs in this thread.

    Django would raise ``SynchronousOnlyOperation`` at the first query; this
    says which awaitable to use instead. ``DJANGO_ALLOW_ASYNC_UNSAFE`` lifts
    both checks, as it lifts Django's.
    """
    # asyncio's own test, without the RuntimeError get_running_loop() raises
    # (and the environment lookup) in the usual case, where no loop runs.
    if asyncio._get_running_loop() is None or os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE"):
        return
    raise SoniqError(
        ErrorCode.ASYNC_CONTEXT,
        f"{what}() cannot run while an event loop runs in this thread (an async view or "
        f"task); use 'await {twin}(...)' instead",
    )


def write_alias(using: str | None) -> str:
    """The database alias jobs are written to: ``using``, else the routers' write alias."""
    return using or router.db_for_write(Job)


def read_alias(using: str | None) -> str:
    """The database alias jobs are read from: ``using``, else the routers' read alias."""
    return using or router.db_for_read(Job)


def enqueue(
    job_name: str,
    args: dict[str, Any] | None = None,
    *,
    queue: str | None = None,
    priority: int | None = None,
    run_at: dt.datetime | dt.timedelta | None = None,
    max_attempts: int | None = DEFAULT_MAX_ATTEMPTS,
    unique_job: bool = False,
    dedup_key: str | None = None,
    producer_id: str | None = None,
    job_id: uuid.UUID | str | None = None,
    using: str | None = None,
    delay: float | dt.timedelta | None = None,
    depends_on: Iterable[uuid.UUID | str] | None = None,
    concurrency_key: str | None = None,
    key_concurrency: int | None = None,
    key_rate: str | None = None,
) -> uuid.UUID:
    """Insert one job inside the caller's transaction and return its id.

    With ``depends_on`` (job ids) the job is not claimed before every one of
    them is done; if one ends cancelled or dead-lettered, it is cancelled
    (``last_error`` ``dependency_failed:<id>``). A dependency that exists in
    neither job table raises ``ConfigValidationError(UNKNOWN_DEPENDENCY)``
    (docs/workflows.md). With ``concurrency_key`` (a string) the job is limited
    per key: at most ``key_concurrency`` jobs of its key run at once, at most
    ``key_rate`` (``"N/s"``) start in any window (docs/keys.md).

    A unique job (``unique_job=True``) or one with a ``dedup_key`` returns the
    id of an equal job that is still queued instead of inserting a second.
    The job name need not have a handler in this process. ``run_at`` is an
    aware datetime or a ``timedelta`` from now; ``delay`` (seconds or a
    ``timedelta``) is that countdown by another name. A countdown is counted
    from the database's clock when the row is inserted (``database_now``).

    Raises ``ConfigValidationError`` (INVALID_TASK_NAME, TASK_ARGS_INVALID,
    INVALID_MAX_ATTEMPTS, INVALID_OPTION) for bad input, and ``SoniqError``
    with DUPLICATE_JOB_ID, QUEUE_PERSISTENCE_FAILED (the database was
    unavailable: the same call may succeed later) or QUEUE_DATABASE_REFUSED
    (any other database error) -- never a ``django.db`` error. Nothing is
    written when it raises. Warns (``RuntimeWarning``) when a transaction is
    open on another database alias but none on the jobs alias: the job then
    commits at once, whatever that transaction does. Called while an event
    loop runs (an async view), raises ``SoniqError(ASYNC_CONTEXT)``: await
    ``aenqueue`` there.
    """
    refuse_event_loop("enqueue", "aenqueue")
    prepared = prepare_to_insert(JobRequest(
        job_name,
        args,
        queue=queue,
        priority=priority,
        run_at=run_at,
        max_attempts=max_attempts,
        unique_job=unique_job,
        dedup_key=dedup_key,
        producer_id=producer_id,
        job_id=job_id,
        delay=delay,
        depends_on=depends_on,
        concurrency_key=concurrency_key,
        key_concurrency=key_concurrency,
        key_rate=key_rate,
    ))
    alias = using or router.db_for_write(Job)
    connection = connections[alias]
    if not connection.in_atomic_block and len(connections.settings) > 1:
        warn_if_uncoupled(alias)  # the test it starts with, made here on the one lookup
    return _insert(prepared, alias, connection)


def bulk_enqueue(requests: Iterable[JobRequest], *, using: str | None = None) -> list[uuid.UUID]:
    """Enqueue many jobs in one transaction; return their ids in request order.

    Every request is validated before anything is written, so one bad request
    leaves no rows at all. Plain jobs go in as one multi-row insert (on
    PostgreSQL from ``_copy.COPY_MIN_JOBS`` of them on, one COPY); unique and
    dedup jobs are resolved one by one (a later request can return an earlier
    one's id). Raises and warns as ``enqueue`` does (``abulk_enqueue`` is
    the async twin).
    """
    refuse_event_loop("bulk_enqueue", "abulk_enqueue")
    prepared = prepare_all(requests)
    if not prepared:
        return []
    alias = write_alias(using)
    warn_if_uncoupled(alias)
    return insert_many_prepared(prepared, alias)


def insert_many_prepared(prepared: list[PreparedJob], alias: str) -> list[uuid.UUID]:
    """Insert validated jobs in one transaction (``bulk_enqueue`` after validation)."""
    connection = connections[alias]
    prepared = _due(prepared, connection)
    if tracing.carrying():  # a sampled span is current: the jobs carry its context
        names = {job.job_name for job in prepared}
        queues = {job.queue for job in prepared}
        ids = tracing.producing(
            names.pop() if len(names) == 1 else None, queues.pop() if len(queues) == 1 else None,
            len(prepared), lambda trace: _write_many(prepared, alias, connection, trace))
    else:
        ids = _write_many(prepared, alias, connection, None)
    _enqueued(alias)
    signals.enqueued(prepared, ids, alias, bulk=True)
    return ids


def _write_many(prepared: list[PreparedJob], alias: str, connection: Any,
                trace: "tracing.Carrier | None") -> list[uuid.UUID]:
    """Insert ``prepared`` (due times resolved); with ``trace``, its rows in soniq_job_trace
    in the same transaction."""
    if trace is not None:
        with translating(alias), transaction.atomic(using=alias):
            ids = _write_many(prepared, alias, connection, None)
            tracing.keep(alias, ids, trace)
        return ids
    if any(job.depends_on is not None or job.key is not None for job in prepared):
        return _write_with_dependents(prepared, alias, connection)
    if connection.vendor == "postgresql":
        from . import _copy, _pg  # here, not at the top: psycopg is needed on PostgreSQL alone

        copied = (_copy.enqueue_many(prepared, connection, alias)
                  if _copy.applies(prepared, connection) else None)
        return _pg.enqueue_many(prepared, connection, alias) if copied is None else copied
    return _insert_many_portable(prepared, alias)


def _write_with_dependents(prepared: list[PreparedJob], alias: str, connection: Any
                           ) -> list[uuid.UUID]:
    """A bulk enqueue with jobs that wait or have a key: the others first (one bulk
    insert), then the keyed ones that wait for nothing (``write_keyed_many``: one call),
    then the waiting ones together (``write_dependents``: one call; one by one in order
    when some of them are keyed), in one transaction. A job may so depend on any job of the bulk
    that waits for nothing, and on a waiting one before it."""
    from .dependencies import write_dependents
    from .keyed import write_keyed_dependent, write_keyed_many

    ids: list[uuid.UUID | None] = [None] * len(prepared)
    with translating(alias), transaction.atomic(using=alias):
        free = [index for index, job in enumerate(prepared)
                if job.depends_on is None and job.key is None]
        if free:
            for index, job_id in zip(free, _write_many([prepared[i] for i in free], alias,
                                                       connection, None)):
                ids[index] = job_id
        keyed = [index for index, job in enumerate(prepared)
                 if job.depends_on is None and job.key is not None]
        if keyed:
            for index, job_id in zip(keyed, write_keyed_many([prepared[i] for i in keyed],
                                                             alias, connection)):
                ids[index] = job_id
        waiting = [index for index, job in enumerate(prepared) if job.depends_on is not None]
        if any(prepared[index].key is not None for index in waiting):
            # A keyed job that waits: each in order, so that any may name an earlier one.
            for index in waiting:
                ids[index] = (write_dependents([prepared[index]], alias, connection)[0]
                              if prepared[index].key is None
                              else write_keyed_dependent(prepared[index], alias, connection))
        else:
            for index, job_id in zip(waiting, write_dependents([prepared[i] for i in waiting],
                                                               alias, connection)):
                ids[index] = job_id
    return [job_id for job_id in ids if job_id is not None]


def _insert_many_portable(prepared: list[PreparedJob], alias: str) -> list[uuid.UUID]:
    ids: list[uuid.UUID] = []
    with translating(alias), transaction.atomic(using=alias):
        plain = [job for job in prepared if not job.deduplicates]
        if plain:
            # A taken id is SONIQ_DUPLICATE_JOB_ID (see errors.translate).
            with transaction.atomic(using=alias):
                Job.objects.using(alias).bulk_create([_row(job) for job in plain])
            if _id_held_by_dead_letter(plain, alias):  # after the write, as in _insert_portable
                raise _duplicate_id_error()
        for job in prepared:
            ids.append(_insert_portable(job, alias) if job.deduplicates else job.job_id)
    return ids


def insert_prepared(job: PreparedJob, alias: str) -> uuid.UUID:
    """Insert a validated job, or return the queued duplicate's id.

    On PostgreSQL this is a call to ``soniq_enqueue``; elsewhere the same
    rules run here.
    """
    return _insert(job, alias, connections[alias])


def _insert(job: PreparedJob, alias: str, connection: Any) -> uuid.UUID:
    """``insert_prepared`` on ``connection`` (``connections[alias]``)."""
    if job.delay is not None:
        job = job.due_from(database_now(connection))
    if _carrying():  # a sampled span is current: the job carries its context
        job_id = tracing.producing(job.job_name, job.queue, 1, lambda trace: [
            _write(job, alias, connection, trace)])[0]
    else:
        job_id = _write(job, alias, connection, None)
    _enqueued(alias)
    if signals.job_enqueued.receivers:
        signals.enqueued([job], [job_id], alias, bulk=False)
    return job_id


def _write(job: PreparedJob, alias: str, connection: Any, trace: "tracing.Carrier | None"
           ) -> uuid.UUID:
    """Insert ``job`` (due time resolved); with ``trace``, its row in soniq_job_trace too: on
    PostgreSQL in the same statement, elsewhere in the same transaction."""
    if job.depends_on is not None:
        from .dependencies import write_dependent
        from .keyed import write_keyed_dependent

        write = write_dependent if job.key is None else write_keyed_dependent
        return _traced(write, job, alias, connection, trace)
    if job.key is not None:
        from .keyed import write_keyed

        return _traced(write_keyed, job, alias, connection, trace)
    if connection.vendor == "postgresql":
        job_id: uuid.UUID = (_pg_module or _import_pg()).enqueue(job, connection, alias, trace)
        return job_id
    if job.job_id is SERVER_MADE_ID:
        job = dataclasses.replace(job, job_id=uuid.uuid4())
    with translating(alias):
        if trace is None:
            return _insert_portable(job, alias)
        with transaction.atomic(using=alias):
            job_id = _insert_portable(job, alias)
            tracing.keep(alias, [job_id], trace)
        return job_id


def _traced(write: Callable[[PreparedJob, str, Any], uuid.UUID], job: PreparedJob, alias: str,
            connection: Any, trace: "tracing.Carrier | None") -> uuid.UUID:
    """``write(job, alias, connection)`` (a dependent's, a keyed job's), with ``trace``'s row
    in soniq_job_trace in the same transaction."""
    if trace is None:
        return write(job, alias, connection)
    with translating(alias), transaction.atomic(using=alias):
        job_id = write(job, alias, connection)
        tracing.keep(alias, [job_id], trace)
    return job_id


_carrying = tracing.carrying

# producer/_pg.py once imported: psycopg is needed on PostgreSQL alone, and an
# import statement in _insert costs a lookup of the package per call.
_pg_module: Any = None


def _import_pg() -> Any:
    global _pg_module
    from . import _pg

    _pg_module = _pg
    return _pg


def database_now(connection: Any) -> dt.datetime:
    """The time by the clock workers compare ``scheduled_at`` with.

    PostgreSQL's ``clock_timestamp()`` (claims read it after their lock); on
    SQLite, whose claims take this process's time, ``timezone.now()``.
    """
    now: dt.datetime
    if connection.vendor != "postgresql":
        now = timezone.now()
        return now
    with translating(connection.alias), connection.cursor() as cursor:
        cursor.execute("SELECT pg_catalog.clock_timestamp()")
        now = cursor.fetchone()[0]
        return now


def _due(prepared: list[PreparedJob], connection: Any) -> list[PreparedJob]:
    """The jobs with their countdowns counted from one reading of the database's clock."""
    if all(job.delay is None for job in prepared):
        return prepared
    now = database_now(connection)
    return [job.due_from(now) for job in prepared]


def _id_held_by_dead_letter(jobs: list[PreparedJob], alias: str) -> bool:
    """Whether a requested job id is held by a dead-lettered job (soniq_enqueue's check)."""
    requested = [job.job_id for job in jobs if not job.job_id_generated]
    return bool(requested) and DeadLetterJob.objects.using(alias).filter(
        id__in=requested).exists()


def _insert_portable(job: PreparedJob, alias: str) -> uuid.UUID:
    # Insert first and look for the duplicate only on conflict: the first
    # statement is a write, so SQLite never has to upgrade a read lock
    # (which fails at once instead of waiting), and PostgreSQL waits on the
    # unique index for a concurrent producer instead of racing a SELECT.
    with transaction.atomic(using=alias):
        try:
            with transaction.atomic(using=alias):
                _row(job).save(using=alias, force_insert=True)
        except IntegrityError as error:
            if sqlstate(error) != "23505":  # a check or a trigger: not a duplicate
                raise translate(error, alias) from None
            existing = _queued_duplicate(job, alias) if job.deduplicates else None
            if existing is not None:
                return existing
            if Job.objects.using(alias).filter(id=job.job_id).exists():
                raise _duplicate_id_error() from None
            raise SoniqError(
                ErrorCode.QUEUE_PERSISTENCE_FAILED,
                "a concurrent enqueue of an equal job is not visible to this transaction; retry it",
            ) from None
        # An id is taken while either table holds it: a dead-lettered job
        # keeps its id, and a replay brings it back under that id. Checked
        # after the write (which rolls back): see above.
        if _id_held_by_dead_letter([job], alias):
            raise _duplicate_id_error()
    return job.job_id


def _duplicate_id_error() -> SoniqError:
    return SoniqError(ErrorCode.DUPLICATE_JOB_ID, "a job with the requested job_id already exists")


def _row(job: PreparedJob) -> Job:
    return Job(
        id=job.job_id,
        job_name=job.job_name,
        args=job.args,
        args_hash=job.args_hash,
        status=JobStatus.QUEUED,
        attempts=0,
        max_attempts=job.max_attempts,
        queue=job.queue,
        priority=job.priority,
        unique_job=job.unique_job,
        dedup_key=job.dedup_key,
        scheduled_at=job.scheduled_at,
        producer_id=job.producer_id,
    )


def _queued_duplicate(job: PreparedJob, alias: str) -> uuid.UUID | None:
    queued = Job.objects.using(alias).filter(status=JobStatus.QUEUED)
    if job.dedup_key is not None:
        found: uuid.UUID | None = queued.filter(
            dedup_key=job.dedup_key).values_list("id", flat=True).first()
        if found is not None:
            return found
    if job.unique_job:
        found = (
            queued.filter(job_name=job.job_name, args_hash=job.args_hash)
            .values_list("id", flat=True)
            .first()
        )
        return found
    return None


_PG_FIELDS = (
    "id", "job_name", "status", "queue", "attempts", "max_attempts", "result", "last_error",
    "dead_letter_reason", "scheduled_at", "created_at", "updated_at",
)
_INFO_FIELDS = (
    "id", "job_name", "status", "queue", "attempts", "max_attempts", "result",
    "last_error", "scheduled_at", "created_at", "updated_at",
)


def get_job(job_id: uuid.UUID | str, *, using: str | None = None) -> JobInfo | None:
    """Return the job with this id, or None when it is unknown or its result expired.

    Dead-lettered jobs come back with status ``dead_letter`` and their reason.
    Raises ``ConfigValidationError`` (INVALID_OPTION) when ``job_id`` is not a
    UUID, and ``SoniqError`` (QUEUE_PERSISTENCE_FAILED or QUEUE_DATABASE_REFUSED)
    when the database fails -- never a ``django.db`` error; while an event
    loop runs, ``SoniqError(ASYNC_CONTEXT)`` (await ``aget_job`` there).
    """
    refuse_event_loop("get_job", "aget_job")
    return get_coerced(coerce_job_id(job_id), read_alias(using))


def get_coerced(job_id: uuid.UUID, alias: str) -> JobInfo | None:
    """``get_job`` of a checked id on ``alias``."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        from . import _pg  # psycopg: PostgreSQL alone (as in insert_many_prepared)

        row = _pg.get_job_row(job_id, connection)
        return None if row is None else info_from_row(row)
    with translating(alias):
        return _get_portable(job_id, alias)


def info_from_row(row: tuple[Any, ...]) -> JobInfo:
    """The ``JobInfo`` of a row of ``_pg.GET_JOB`` (its jsonb result already parsed)."""
    done, total, note, at = row[12:16]
    return JobInfo(**dict(zip(_PG_FIELDS, row[:12])),
                   progress=None if done is None else progress.as_dict(done, total, note, at),
                   steps=tuple(row[16] or ()))


def _get_portable(job_id: uuid.UUID, alias: str) -> JobInfo | None:
    live = (
        Job.objects.using(alias)
        .filter(id=job_id)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=Now()))
        .values(*_INFO_FIELDS)
        .first()
    )
    if live is not None:
        return JobInfo(**live, dead_letter_reason=None, progress=progress.read(job_id, alias),
                       steps=_step_names(job_id, alias))
    dead = DeadLetterJob.objects.using(alias).filter(id=job_id).first()
    if dead is None or (
        # Replayed since it last failed: the dead letter no longer describes the job.
        dead.last_resurrection_at is not None
        and dead.last_resurrection_at >= dead.moved_to_dead_letter_at
    ):
        return None
    return JobInfo(
        id=dead.id,
        job_name=dead.job_name,
        status="dead_letter",
        queue=dead.queue,
        attempts=dead.attempts,
        max_attempts=dead.max_attempts,
        result=None,
        last_error=dead.last_error,
        dead_letter_reason=dead.dead_letter_reason,
        scheduled_at=None,
        created_at=dead.original_created_at,
        updated_at=dead.moved_to_dead_letter_at,
        progress=progress.read(job_id, alias),
        steps=_step_names(job_id, alias),
    )


def _step_names(job_id: uuid.UUID, alias: str) -> tuple[str, ...]:
    """The names of the job's recorded steps, in the order they were recorded (the ORM)."""
    from ..models import JobStep

    return tuple(JobStep.objects.using(alias).filter(job_id=job_id)
                 .order_by("recorded_at", "name").values_list("name", flat=True))
