"""Enqueueing a job that waits for others (``depends_on``): the producer's side of workflows.

On PostgreSQL one call of ``soniq_enqueue_after`` (``sql/producer_api_v5.sql``)
checks the dependencies, inserts the job at ``WAITING_SCHEDULED_AT`` through
``soniq_enqueue``'s own checks and writes its edges and counter;
``_enqueue_after_portable`` is its SQLite twin. The database settles the
waiting jobs afterwards (``sql/workflows_v1.sql``); ``workflows.py`` builds
batches and chains on this. See docs/workflows.md and decision 0044.
"""

import dataclasses
import datetime as dt
import uuid
from typing import Any

from django.db import transaction
from django.utils import timezone

from ..conf import get_settings
from ..errors import ConfigValidationError, ErrorCode, translating
from ..models import (WAITING_SCHEDULED_AT, DeadLetterJob, DependencyState, Job, JobDependency,
                      JobStatus, JobWait)
from .request import SERVER_MADE_ID, PreparedJob

__all__ = ["write_dependent"]


def _unknown_dependency() -> ConfigValidationError:
    return ConfigValidationError("a job named in depends_on does not exist (in either job "
                                 "table)", code=ErrorCode.UNKNOWN_DEPENDENCY)


def write_dependent(job: PreparedJob, alias: str, connection: Any) -> uuid.UUID:
    """Insert ``job`` (its ``depends_on`` set, due time resolved) waiting for its dependencies.

    Returns its id, or an equal queued job's for a unique or dedup job (which
    then stays as it is). Raises ``ConfigValidationError(UNKNOWN_DEPENDENCY)``
    when a dependency is in neither job table, and what ``enqueue`` raises.
    """
    assert job.depends_on is not None
    ttl = float(get_settings().RESULT_TTL)
    if connection.vendor == "postgresql":
        with translating(alias), connection.cursor() as cursor:
            cursor.execute(
                "SELECT soniq_enqueue_after(%s::uuid[], %s, %s::jsonb, %s, %s, %s, %s, %s, %s,"
                " %s, %s, %s, %s)",
                [list(job.depends_on), job.job_name, job.args_json, job.queue, job.priority,
                 job.scheduled_at, job.max_attempts, job.unique_job, job.dedup_key,
                 job.producer_id, None if job.job_id is SERVER_MADE_ID else job.job_id,
                 job.any_outcome, ttl])
            (found,) = cursor.fetchone()
        return found if isinstance(found, uuid.UUID) else uuid.UUID(str(found))
    if job.job_id is SERVER_MADE_ID:
        job = dataclasses.replace(job, job_id=uuid.uuid4())
    with translating(alias), transaction.atomic(using=alias):
        return _enqueue_after_portable(job, alias, ttl)


def _enqueue_after_portable(job: PreparedJob, alias: str, ttl: float) -> uuid.UUID:
    """``soniq_enqueue_after`` for SQLite (one writer at a time: the first write takes the
    database's lock, which orders this enqueue against the write that ends a dependency)."""
    from .api import _insert_portable

    deps = list(job.depends_on or ())
    jobs = Job.objects.using(alias)
    # 1. The mark, as the first statement: a write, so the lock is taken at once.
    if deps:
        jobs.filter(id__in=deps, status__in=[JobStatus.QUEUED, JobStatus.PROCESSING]).exclude(
            has_dependents=True).update(has_dependents=True)
    # 2. Their states; an unknown one refuses the enqueue.
    statuses = dict(jobs.filter(id__in=deps).values_list("id", "status"))
    missing = [dep for dep in deps if dep not in statuses]
    if missing:
        dead = set(DeadLetterJob.objects.using(alias).filter(id__in=missing)
                   .values_list("id", flat=True))
        if len(dead) < len(missing):
            raise _unknown_dependency()
        statuses.update((dep, "dead_letter") for dep in dead)
    states = {dep: (DependencyState.DONE if status == JobStatus.DONE
                    else DependencyState.WAITING
                    if status in (JobStatus.QUEUED, JobStatus.PROCESSING)
                    else DependencyState.FAILED)
              for dep, status in statuses.items()}
    pending = sum(1 for dep in deps if states[dep] == DependencyState.WAITING)
    failed = None if job.any_outcome else next(
        (dep for dep in deps if states[dep] == DependencyState.FAILED), None)
    # 3. The job, through enqueue's own insert (its checks and duplicates).
    run_at = job.scheduled_at
    held = dataclasses.replace(job, scheduled_at=WAITING_SCHEDULED_AT) if (
        pending or failed is not None) else job
    found = _insert_portable(held, alias)
    if found != job.job_id:
        return found
    # 4. The edges and what is left to wait for.
    JobDependency.objects.using(alias).bulk_create([
        JobDependency(job_id=job.job_id, depends_on=dep, any_outcome=job.any_outcome,
                      state=states[dep]) for dep in deps])
    now = timezone.now()
    if failed is not None:
        jobs.filter(id=job.job_id).update(
            status=JobStatus.CANCELLED, last_error=f"dependency_failed:{failed}",
            scheduled_at=run_at, expires_at=now + dt.timedelta(seconds=ttl), updated_at=now)
    elif pending:
        JobWait.objects.using(alias).create(job_id=job.job_id, pending=pending, run_at=run_at,
                                            created_at=now)
    return job.job_id
