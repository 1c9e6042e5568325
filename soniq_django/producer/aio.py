"""The async twins of the producer API: ``aenqueue``, ``abulk_enqueue``, ``aget_job``.

Each validates and copies its input when it is *called*, in the event
loop's thread -- so bad input raises before any thread hop, and changing
the caller's args afterwards, even before awaiting, cannot change what is
inserted -- then hands the database work to Django's synchronous thread
with ``sync_to_async`` (``thread_sensitive``, as ``OwnedJobSource``'s
twins do). Await what they return. Inside a test whose transaction is held
by that thread (an async test method of a ``TestCase``), the rows go into
that transaction.
"""

import datetime as dt
import uuid
from collections.abc import Awaitable, Iterable
from typing import Any

from asgiref.sync import sync_to_async

from ..conf import DEFAULT_MAX_ATTEMPTS
from .api import (
    JobInfo, get_coerced, insert_many_prepared, insert_prepared, read_alias, write_alias,
)
from .commit import warn_if_uncoupled
from .request import JobRequest, PreparedJob, coerce_job_id, prepare_all, prepare_to_insert


def aenqueue(
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
) -> Awaitable[uuid.UUID]:
    """Async twin of ``enqueue``: await it for the job id.

    Raises ``ConfigValidationError`` for bad input at the call, before
    anything is awaited; the database errors of ``enqueue`` when awaited.
    """
    request = JobRequest(
        job_name, args, queue=queue, priority=priority, run_at=run_at,
        max_attempts=max_attempts, unique_job=unique_job, dedup_key=dedup_key,
        producer_id=producer_id, job_id=job_id, delay=delay, depends_on=depends_on,
    )
    return insert_async(prepare_to_insert(request), write_alias(using))


def abulk_enqueue(requests: Iterable[JobRequest], *, using: str | None = None
                  ) -> Awaitable[list[uuid.UUID]]:
    """Async twin of ``bulk_enqueue``: await it for the ids, in request order.

    Every request is validated at the call; one bad request raises
    ``ConfigValidationError`` there and nothing is written.
    """
    prepared = prepare_all(requests)
    return sync_to_async(_insert_many)(prepared, write_alias(using))


def aget_job(job_id: uuid.UUID | str, *, using: str | None = None
             ) -> Awaitable[JobInfo | None]:
    """Async twin of ``get_job``: await it for the ``JobInfo`` or None.

    A ``job_id`` that is not a UUID raises ``ConfigValidationError`` at the call.
    """
    return sync_to_async(get_coerced)(coerce_job_id(job_id), read_alias(using))


def insert_async(prepared: PreparedJob, alias: str) -> Awaitable[uuid.UUID]:
    """Insert a validated job from async code (``aenqueue``, ``handler.aenqueue``)."""
    return sync_to_async(_insert_one)(prepared, alias)


def _insert_one(prepared: PreparedJob, alias: str) -> uuid.UUID:
    # In the synchronous thread: its connection is the one whose
    # transactions the warning is about.
    warn_if_uncoupled(alias, stacklevel=1)
    return insert_prepared(prepared, alias)


def _insert_many(prepared: list[PreparedJob], alias: str) -> list[uuid.UUID]:
    if not prepared:
        return []
    warn_if_uncoupled(alias, stacklevel=1)
    return insert_many_prepared(prepared, alias)
