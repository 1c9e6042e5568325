"""Enqueueing a job limited per key: the producer's side of keys.

On PostgreSQL one call of ``soniq_enqueue_keyed`` (sql/claim_protocol_v12.sql)
runs ``soniq_enqueue``'s checks, inserts the job parked, records the key's
declared limits and offers the key's next job if it has room;
``_enqueue_keyed_portable`` is its SQLite twin (the admission itself is the
trigger ``soniq_key_admit`` there). See docs/keys.md and decision 0047.
"""

import dataclasses
import datetime as dt
import uuid
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ..errors import translating
from ..keys.models import KEY_PARKED_AT, KeyParked, KeySlot
from ..models import Job, JobStatus, JobWait
from .request import SERVER_MADE_ID, PreparedJob

__all__ = ["park", "write_keyed", "write_keyed_dependent", "write_keyed_many"]

_ENQUEUE_KEYED = (
    "SELECT soniq_enqueue_keyed(%s, %s, %s, %s, %s::jsonb, %s, %s, %s, %s, %s, %s, %s, %s)")


def write_keyed(job: PreparedJob, alias: str, connection: Any) -> uuid.UUID:
    """Insert ``job`` (its ``key`` set, due time resolved) parked under its key.

    Returns its id, or an equal queued job's for a unique or dedup job (which
    then stays as it is). Raises what ``enqueue`` raises.
    """
    key = job.key
    assert key is not None
    if connection.vendor == "postgresql":
        with translating(alias), connection.cursor() as cursor:
            cursor.execute(_ENQUEUE_KEYED, [
                key.key, key.concurrency, key.rate, job.job_name, job.args_json, job.queue,
                job.priority, job.scheduled_at, job.max_attempts, job.unique_job,
                job.dedup_key, job.producer_id,
                None if job.job_id is SERVER_MADE_ID else job.job_id])
            (found,) = cursor.fetchone()
        return found if isinstance(found, uuid.UUID) else uuid.UUID(str(found))
    if job.job_id is SERVER_MADE_ID:
        job = dataclasses.replace(job, job_id=uuid.uuid4())
    with translating(alias), transaction.atomic(using=alias):
        return _enqueue_keyed_portable(job, alias)


_ENQUEUE_KEYED_AFTER = (
    "SELECT soniq_enqueue_keyed_after(%s, %s, %s, %s::uuid[], %s, %s::jsonb, %s, %s, %s, %s,"
    " %s, %s, %s, %s, %s, %s)")


def write_keyed_dependent(job: PreparedJob, alias: str, connection: Any) -> uuid.UUID:
    """Insert ``job`` (its ``key`` and ``depends_on`` set, due time resolved).

    It waits for its dependencies as ``write_dependent`` has it, unparked;
    once they are done the database parks it under its key (PostgreSQL:
    ``soniq_settle_dependents_v2``; SQLite: the trigger ``soniq_key_released``).
    One that waits for nothing is parked at once; one whose dependency failed
    is cancelled. Returns its id, or an equal queued job's for a unique or
    dedup job. Raises what ``write_dependent`` and ``write_keyed`` raise.
    """
    from ..conf import get_settings
    from .dependencies import write_dependent

    key = job.key
    assert key is not None and job.depends_on is not None
    if connection.vendor == "postgresql":
        ttl = float(get_settings().RESULT_TTL)
        with translating(alias), connection.cursor() as cursor:
            cursor.execute(_ENQUEUE_KEYED_AFTER, [
                key.key, key.concurrency, key.rate, list(job.depends_on), job.job_name,
                job.args_json, job.queue, job.priority, job.scheduled_at, job.max_attempts,
                job.unique_job, job.dedup_key, job.producer_id,
                None if job.job_id is SERVER_MADE_ID else job.job_id, job.any_outcome, ttl])
            (found,) = cursor.fetchone()
        return found if isinstance(found, uuid.UUID) else uuid.UUID(str(found))
    if job.job_id is SERVER_MADE_ID:
        job = dataclasses.replace(job, job_id=uuid.uuid4())
    with translating(alias), transaction.atomic(using=alias):
        found = write_dependent(job, alias, connection)
        if found != job.job_id:
            return found
        jobs = Job.objects.using(alias)
        jobs.filter(id=job.job_id).update(concurrency_key=key.key)
        _configure(job, alias)
        if not JobWait.objects.using(alias).filter(job_id=job.job_id).exists():
            _park_portable(job.job_id, job.scheduled_at, alias)  # nothing to wait for
        return job.job_id


def write_keyed_many(jobs: list[PreparedJob], alias: str, connection: Any) -> list[uuid.UUID]:
    """``write_keyed`` of each job of ``jobs`` (each with its ``key``, none with
    ``depends_on``), in order, in one transaction: set-based.

    On PostgreSQL one call of ``soniq_enqueue_keyed_many`` (sql/key_park_v1.sql); on
    SQLite its twin, a few statements for the list and a few per key. Writes what one
    ``write_keyed`` per job writes. Returns the ids in order.
    """
    if connection.vendor == "postgresql":
        from ._pg import _json  # psycopg is needed on PostgreSQL alone

        rows = []
        for job in jobs:
            key = job.key
            assert key is not None
            row = job.as_json_row()
            row["concurrency_key"] = key.key
            if key.concurrency is not None:
                row["key_concurrency"] = key.concurrency
            if key.rate is not None:
                row["key_rate"] = key.rate
            rows.append(row)
        with translating(alias), connection.cursor() as cursor:
            cursor.execute("SELECT soniq_enqueue_keyed_many(%s::jsonb)", [_json(rows)])
            (found,) = cursor.fetchone()
        return [job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
                for job_id in found]
    jobs = [dataclasses.replace(job, job_id=uuid.uuid4()) if job.job_id is SERVER_MADE_ID
            else job for job in jobs]
    with translating(alias), transaction.atomic(using=alias):
        return _enqueue_keyed_many_portable(jobs, alias)


def _enqueue_keyed_many_portable(jobs: list[PreparedJob], alias: str) -> list[uuid.UUID]:
    """``soniq_enqueue_keyed_many`` for SQLite (the caller holds the write lock)."""
    from .api import _insert_many_portable

    found = _insert_many_portable(
        [dataclasses.replace(job, scheduled_at=KEY_PARKED_AT) for job in jobs], alias)
    new = [job for job, job_id in zip(jobs, found) if job_id == job.job_id]
    if not new:
        return found
    by_key: dict[tuple[str, str], list[PreparedJob]] = {}
    for job in new:
        assert job.key is not None
        by_key.setdefault((job.queue, job.key.key), []).append(job)
    rows = Job.objects.using(alias)
    created = {}
    for (queue, key), group in by_key.items():
        ids = [job.job_id for job in group]
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            rows.filter(id__in=chunk).update(concurrency_key=key)
            created.update(rows.filter(id__in=chunk).values_list("id", "created_at"))
    slots = KeySlot.objects.using(alias)
    for (queue, key), group in sorted(by_key.items()):
        limits = _limits(group[-1])  # the last new job of the key declares its limits
        slot, made = slots.get_or_create(queue=queue, key=key, defaults=limits)
        if not made and any(getattr(slot, name) != value for name, value in limits.items()):
            slots.filter(pk=slot.pk).update(**limits)
    parked = KeyParked.objects.using(alias)
    parked.bulk_create([KeyParked(job_id=job.job_id, queue=job.queue, key=key,
                                  priority=job.priority, created_at=created[job.job_id],
                                  run_at=job.scheduled_at)
                        for (_, key), group in by_key.items() for job in group])
    now = timezone.now()
    for (queue, key), group in sorted(by_key.items()):
        slot = slots.get(queue=queue, key=key)
        if slot.head is not None:  # a head's place, by the enqueue's rule, to a new job
            head = rows.filter(id=slot.head, status=JobStatus.QUEUED).values_list(
                "priority", "created_at").first()
            head_later = slot.head_run_at is not None and slot.head_run_at > now
            better = head is not None and any(
                (head_later or head[0] > job.priority)
                if job.scheduled_at is None or job.scheduled_at <= now
                else (head_later and slot.head_run_at is not None
                      and job.scheduled_at < slot.head_run_at)
                for job in group)
            if head is not None and better:
                rows.filter(id=slot.head).update(scheduled_at=KEY_PARKED_AT)
                parked.create(job_id=slot.head, queue=queue, key=key, priority=head[0],
                              created_at=head[1], run_at=slot.head_run_at)
                slots.filter(pk=slot.pk).update(head=None, head_run_at=None)
        slots.filter(pk=slot.pk).update(pokes=F("pokes") + 1)  # the admission (a trigger)
    return found


def _limits(job: PreparedJob) -> dict[str, int | None]:
    from ..flow import parse_rate

    key = job.key
    assert key is not None
    count, period = parse_rate(key.rate) if key.rate is not None else (None, None)
    return {"configured_concurrency": key.concurrency, "configured_rate_limit": count,
            "configured_rate_period": period}


def _enqueue_keyed_portable(job: PreparedJob, alias: str) -> uuid.UUID:
    """``soniq_enqueue_keyed`` for SQLite (one writer at a time: the insert, the first
    statement, takes the database's lock)."""
    from .api import _insert_portable

    key = job.key
    assert key is not None
    found = _insert_portable(dataclasses.replace(job, scheduled_at=KEY_PARKED_AT), alias)
    if found != job.job_id:
        return found
    Job.objects.using(alias).filter(id=job.job_id).update(concurrency_key=key.key)
    _configure(job, alias)
    _park_portable(job.job_id, job.scheduled_at, alias)
    return job.job_id


def _configure(job: PreparedJob, alias: str) -> None:
    """The limits ``job`` declares become its key's configured ones (SQLite)."""
    key = job.key
    assert key is not None
    slots = KeySlot.objects.using(alias)
    limits = _limits(job)
    slot, made = slots.get_or_create(queue=job.queue, key=key.key, defaults=limits)
    if not made and any(getattr(slot, name) != value for name, value in limits.items()):
        slots.filter(pk=slot.pk).update(**limits)


def park(job_id: uuid.UUID, run_at: dt.datetime | None, alias: str, connection: Any) -> None:
    """Put the queued keyed job ``job_id`` under its key, due at ``run_at``.

    For a job that was not enqueued parked (a replayed dead letter, a keyed
    job with ``depends_on``): the row goes to ``KEY_PARKED_AT``, gets its
    ``soniq_key_parked`` row, takes a head's place as an enqueue does, and the
    key admits its next job if it has room. On PostgreSQL one call of
    ``soniq_key_park_v1`` (sql/key_park_v1.sql); call it inside the write's
    transaction. Nothing happens for a row that is not queued or has no key.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT soniq_key_park_v1(%s, %s)", [job_id, run_at])
        return
    _park_portable(job_id, run_at, alias)


def _park_portable(job_id: uuid.UUID, run_at: dt.datetime | None, alias: str) -> None:
    """``soniq_key_park_v1`` for SQLite (the caller holds the write lock)."""
    jobs = Job.objects.using(alias)
    row = jobs.filter(id=job_id, status=JobStatus.QUEUED, concurrency_key__isnull=False
                      ).values_list("queue", "concurrency_key", "priority", "created_at",
                                    "scheduled_at").first()
    if row is None:
        return
    queue, key, priority, created_at, scheduled_at = row
    slots = KeySlot.objects.using(alias)
    slot, _ = slots.get_or_create(queue=queue, key=key)
    parked = KeyParked.objects.using(alias)
    if slot.head == job_id or parked.filter(job_id=job_id).exists():
        return  # its key holds it already
    if scheduled_at != KEY_PARKED_AT:
        jobs.filter(id=job_id).update(scheduled_at=KEY_PARKED_AT)
    parked.create(job_id=job_id, queue=queue, key=key, priority=priority,
                  created_at=created_at, run_at=run_at)
    if slot.head is not None:  # priorities win inside a key too; a due job, a head not due
        head = jobs.filter(id=slot.head, status=JobStatus.QUEUED).values_list(
            "priority", "created_at").first()
        now = timezone.now()
        head_later = slot.head_run_at is not None and slot.head_run_at > now
        if run_at is None or run_at <= now:
            better = head_later or (head is not None and head[0] > priority)
        else:
            better = (slot.head_run_at is not None and slot.head_run_at > now
                      and run_at < slot.head_run_at)
        if head is not None and better:
            jobs.filter(id=slot.head).update(scheduled_at=KEY_PARKED_AT)
            parked.create(job_id=slot.head, queue=queue, key=key, priority=head[0],
                          created_at=head[1], run_at=slot.head_run_at)
            slots.filter(pk=slot.pk).update(head=None, head_run_at=None)
    slots.filter(pk=slot.pk).update(pokes=F("pokes") + 1)  # the admission (a trigger)
