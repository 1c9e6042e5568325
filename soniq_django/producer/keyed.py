"""Enqueueing a job limited per key: the producer's side of keys.

On PostgreSQL one call of ``soniq_enqueue_keyed`` (sql/claim_protocol_v12.sql)
runs ``soniq_enqueue``'s checks, inserts the job parked, records the key's
declared limits and offers the key's next job if it has room;
``_enqueue_keyed_portable`` is its SQLite twin (the admission itself is the
trigger ``soniq_key_admit`` there). See docs/keys.md and decision 0047.
"""

import dataclasses
import uuid
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from ..errors import translating
from ..keys.models import KEY_PARKED_AT, KeyParked, KeySlot
from ..models import Job, JobStatus
from .request import SERVER_MADE_ID, PreparedJob

__all__ = ["write_keyed"]

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
    jobs = Job.objects.using(alias)
    jobs.filter(id=job.job_id).update(concurrency_key=key.key)
    created_at = jobs.filter(id=job.job_id).values_list("created_at", flat=True).get()
    slots = KeySlot.objects.using(alias)
    limits = _limits(job)
    slot, made = slots.get_or_create(queue=job.queue, key=key.key, defaults=limits)
    if not made and any(getattr(slot, name) != value for name, value in limits.items()):
        slots.filter(pk=slot.pk).update(**limits)
    parked = KeyParked.objects.using(alias)
    parked.create(job_id=job.job_id, queue=job.queue, key=key.key, priority=job.priority,
                  created_at=created_at, run_at=job.scheduled_at)
    if slot.head is not None:  # priorities win inside a key too; a due job, a head not due
        head = jobs.filter(id=slot.head, status=JobStatus.QUEUED).values_list(
            "priority", "created_at").first()
        now = timezone.now()
        head_later = slot.head_run_at is not None and slot.head_run_at > now
        if job.scheduled_at is None or job.scheduled_at <= now:
            better = head_later or (head is not None and head[0] > job.priority)
        else:
            better = (slot.head_run_at is not None and slot.head_run_at > now
                      and job.scheduled_at < slot.head_run_at)
        if head is not None and better:
            jobs.filter(id=slot.head).update(scheduled_at=KEY_PARKED_AT)
            parked.create(job_id=slot.head, queue=job.queue, key=key.key, priority=head[0],
                          created_at=head[1], run_at=slot.head_run_at)
            slots.filter(pk=slot.pk).update(head=None, head_run_at=None)
    slots.filter(pk=slot.pk).update(pokes=F("pokes") + 1)  # the admission (a trigger)
    return job.job_id
