"""Jobs that wait for other jobs: ``depends_on``, ``batch()`` and ``chain()`` (docs/workflows.md).

A job enqueued with ``depends_on=[...]`` is an ordinary queued row scheduled
at ``WAITING_SCHEDULED_AT`` (9999-01-01 UTC, a time no claim reaches, whoever
claims), with one ``soniq_job_dependencies`` row per job it waits for and a
``soniq_job_waits`` row counting the ones still to finish. The database
settles them: the triggers of ``sql/workflows_v1.sql`` (and their SQLite twin)
run in the transaction of the write that ends a job -- a fenced completion, a
failure, a cancel, the move to the dead letters, a foreign worker's own
UPDATE -- and release the dependents whose last dependency is done, or cancel
those that needed a job that failed (``dependency_failed:<id>``), down the
graph. The enqueue of a job that waits is the producer's
(``producer/dependencies.py``); this module builds batches and chains on it
and reads what the admin and ``current_job().batch()`` show.

A batch is its members plus, with ``on_complete``, a callback job that waits
for every member to finish whatever the outcome (``any_outcome``): the
counter row of the callback, updated under its row lock by each member's
ending, reaches 0 exactly once. A chain is each job depending on the one
before.
"""

import dataclasses
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import transaction
from django.utils import timezone

from .errors import ConfigValidationError, ErrorCode, translating
from .models import Batch, BatchMember, JobDependency, JobWait
from .producer.request import JobRequest, prepare

__all__ = ["BatchInfo", "batch", "chain", "batch_on_commit", "chain_on_commit",
           "batch_members", "dependencies_of", "dependents_of"]


@dataclasses.dataclass(frozen=True)
class BatchInfo:
    """What ``batch()`` made: the batch's id, its members' job ids (in the order given),
    and the ``on_complete`` job's id (None without one)."""

    id: uuid.UUID
    job_ids: tuple[uuid.UUID, ...]
    callback_id: uuid.UUID | None


def _alias(using: str | None) -> str:
    from .producer.api import write_alias

    return write_alias(using)


def _check_requests(requests: Iterable[JobRequest], what: str) -> list[JobRequest]:
    listed = list(requests)
    for request in listed:
        if not isinstance(request, JobRequest):
            raise ConfigValidationError(f"{what} takes JobRequest objects, not "
                                        f"{type(request).__name__}")
    return listed


def _callback_request(on_complete: Any, members: Sequence[uuid.UUID]) -> JobRequest:
    if not isinstance(on_complete, JobRequest):
        raise ConfigValidationError(f"on_complete must be a JobRequest, not "
                                    f"{type(on_complete).__name__}")
    if on_complete.depends_on is not None:
        raise ConfigValidationError("on_complete waits for the batch's members: give it no "
                                    "depends_on of its own", code=ErrorCode.INVALID_OPTION)
    return dataclasses.replace(on_complete, depends_on=list(members))


def batch(requests: Iterable[JobRequest], *, on_complete: JobRequest | None = None,
          using: str | None = None) -> BatchInfo:
    """Enqueue ``requests`` together, inside the caller's transaction; with ``on_complete``,
    a job enqueued now that runs once, when every member has finished, whatever the outcome.

    Its handler reads the members' outcomes with ``current_job().batch()``.
    Members may have ``depends_on`` of their own; ``on_complete`` may not.
    Raises what ``bulk_enqueue`` raises; nothing is written when it raises.
    """
    from .producer.api import refuse_event_loop

    refuse_event_loop("batch", "batch_on_commit")
    listed = _check_requests(requests, "batch()")
    alias = _alias(using)
    if on_complete is not None:
        _callback_request(on_complete, [])  # checked before anything is written
    with translating(alias), transaction.atomic(using=alias):
        return _write_batch(listed, on_complete, alias, uuid.uuid4())


def _write_batch(listed: list[JobRequest], on_complete: JobRequest | None,
                 alias: str, batch_id: uuid.UUID) -> BatchInfo:
    from .producer.api import bulk_enqueue, insert_prepared

    ids = bulk_enqueue(listed, using=alias) if listed else []
    callback_id = None
    if on_complete is not None:
        prepared = dataclasses.replace(prepare(_callback_request(on_complete, ids)),
                                       any_outcome=True)
        callback_id = insert_prepared(prepared, alias)
    Batch.objects.using(alias).create(id=batch_id, size=len(ids), callback_id=callback_id,
                                      created_at=timezone.now())
    BatchMember.objects.using(alias).bulk_create([
        BatchMember(batch_id=batch_id, position=position, job_id=job_id)
        for position, job_id in enumerate(ids)])
    return BatchInfo(batch_id, tuple(ids), callback_id)


def chain(*requests: JobRequest, using: str | None = None) -> list[uuid.UUID]:
    """Enqueue ``requests`` to run one after another, inside the caller's transaction: each
    depends on the one before (and on its own ``depends_on``). Returns their ids in order.

    If one ends cancelled or dead-lettered, the rest are cancelled
    (``dependency_failed:<id>``). Nothing is written when it raises.
    """
    from .producer.api import refuse_event_loop

    refuse_event_loop("chain", "chain_on_commit")
    listed = _check_requests(requests, "chain()")
    alias = _alias(using)
    with translating(alias), transaction.atomic(using=alias):
        return _write_chain(listed, alias)


def _write_chain(listed: list[JobRequest], alias: str) -> list[uuid.UUID]:
    from .producer.api import insert_prepared

    prepared = [prepare(request) for request in listed]  # all checked before any write
    ids: list[uuid.UUID] = []
    for job in prepared:
        if ids:
            job = dataclasses.replace(job, depends_on=(*(job.depends_on or ()), ids[-1]))
        ids.append(insert_prepared(job, alias))
    return ids


def _pinned(requests: list[JobRequest]) -> list[JobRequest]:
    """``requests`` with an id each (kept, or drawn now), for an insert after the commit."""
    return [request if request.job_id is not None
            else dataclasses.replace(request, job_id=uuid.uuid4()) for request in requests]


def batch_on_commit(requests: Iterable[JobRequest], *, on_complete: JobRequest | None = None,
                    using: str | None = None) -> BatchInfo:
    """``batch()`` once the caller's transactions commit (as ``enqueue_on_commit``); the ids
    are drawn now and returned at once. Outside a transaction it runs at once.

    A unique or dedup member that finds an equal queued job at commit is that job
    instead, as with ``enqueue_on_commit``: its id in ``job_ids`` then names no row.
    """
    from .producer.commit import after_commit

    listed = _pinned(_check_requests(requests, "batch_on_commit()"))
    for request in listed:
        prepare(request)  # checked now, as enqueue_on_commit checks
    callback = None
    if on_complete is not None:
        callback = _pinned([_callback_request(on_complete, [])])[0]
        callback = dataclasses.replace(callback, depends_on=None)
        prepare(callback)
    alias = _alias(using)
    batch_id = uuid.uuid4()
    ids = tuple(coerce(request.job_id) for request in listed)

    def write() -> None:
        with translating(alias), transaction.atomic(using=alias):
            _write_batch(listed, callback, alias, batch_id)

    after_commit(write, alias)
    return BatchInfo(batch_id, ids, None if callback is None else coerce(callback.job_id))


def chain_on_commit(*requests: JobRequest, using: str | None = None) -> list[uuid.UUID]:
    """``chain()`` once the caller's transactions commit; the ids are drawn now."""
    from .producer.commit import after_commit

    listed = _pinned(_check_requests(requests, "chain_on_commit()"))
    for request in listed:
        prepare(request)
    alias = _alias(using)

    def write() -> None:
        with translating(alias), transaction.atomic(using=alias):
            _write_chain(listed, alias)

    after_commit(write, alias)
    return [coerce(request.job_id) for request in listed]


def coerce(value: Any) -> uuid.UUID:
    from .producer.request import coerce_job_id

    return coerce_job_id(value)


def batch_members(job_id: uuid.UUID | str, *, using: str | None = None) -> list[Any] | None:
    """The ``JobInfo`` of each member of the batch whose callback (or member) is ``job_id``,
    in the order given; None when the job belongs to no batch. A member whose row is gone
    (purged) is left out."""
    from .producer.api import get_coerced, read_alias

    alias = read_alias(using)
    key = coerce(job_id)
    with translating(alias):
        found = Batch.objects.using(alias).filter(callback_id=key).values_list(
            "id", flat=True).first()
        if found is None:
            found = BatchMember.objects.using(alias).filter(job_id=key).values_list(
                "batch_id", flat=True).first()
        if found is None:
            return None
        members = list(BatchMember.objects.using(alias).filter(batch_id=found)
                       .order_by("position").values_list("job_id", flat=True))
    infos = [get_coerced(member, alias) for member in members]
    return [info for info in infos if info is not None]


def dependencies_of(job_id: uuid.UUID, alias: str) -> list[tuple[uuid.UUID, str, bool]]:
    """``(depends_on, state, any_outcome)`` of each job ``job_id`` waits (or waited) for."""
    return [(row.depends_on, row.state, row.any_outcome) for row in
            JobDependency.objects.using(alias).filter(job_id=job_id).order_by("id")]


def dependents_of(job_id: uuid.UUID, alias: str) -> list[tuple[uuid.UUID, str, bool]]:
    """``(job_id, state, any_outcome)`` of each job that waits (or waited) for ``job_id``."""
    return [(row.job_id, row.state, row.any_outcome) for row in
            JobDependency.objects.using(alias).filter(depends_on=job_id).order_by("id")]


def waiting(job_id: uuid.UUID, alias: str) -> int | None:
    """How many dependencies job ``job_id`` still waits for; None when it waits for none."""
    found: int | None = JobWait.objects.using(alias).filter(job_id=job_id).values_list(
        "pending", flat=True).first()
    return found
