"""Enqueueing a job that waits for others (``depends_on``): the producer's side of workflows.

On PostgreSQL one call of ``soniq_enqueue_after`` (``sql/producer_api_v5.sql``)
checks the dependencies, inserts the job at ``WAITING_SCHEDULED_AT`` through
``soniq_enqueue``'s own checks and writes its edges and counter;
``_enqueue_after_portable`` is its SQLite twin. A bulk enqueue writes all its
waiting jobs at once (``write_dependents``): one call of
``soniq_enqueue_after_many`` (``sql/producer_api_v6.sql``, decision 0045),
or its SQLite twin, a few statements for the whole list. The database
settles the waiting jobs afterwards (``sql/workflows_v1.sql``);
``workflows.py`` builds batches and chains on this. See docs/workflows.md
and decision 0044.
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

__all__ = ["write_dependent", "write_dependents"]

#: Ids per ``IN (...)`` on SQLite (its limit on a statement's parameters is 999 in old builds).
_SQLITE_CHUNK = 500
# DependencyState's values, as plain text for the set-based twin.
_DONE, _WAITING, _FAILED = "done", "waiting", "failed"


def _unknown_dependency() -> ConfigValidationError:  # no id: the message carries no job data
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


def write_dependents(jobs: list[PreparedJob], alias: str, connection: Any) -> list[uuid.UUID]:
    """``write_dependent`` of each job of ``jobs``, in order, in one transaction: set-based.

    A job may name an earlier one of ``jobs`` (by its ``job_id``). Returns
    the ids in order. Raises as ``write_dependent`` does; an unknown
    dependency anywhere refuses the whole list, and nothing is written.
    """
    ttl = float(get_settings().RESULT_TTL)
    if connection.vendor == "postgresql":
        from ._pg import _json  # psycopg is needed on PostgreSQL alone

        rows = [_after_row(job) for job in jobs]
        with translating(alias), connection.cursor() as cursor:
            cursor.execute("SELECT soniq_enqueue_after_many(%s::jsonb, %s)", [_json(rows), ttl])
            (found,) = cursor.fetchone()
        return [job_id if isinstance(job_id, uuid.UUID) else uuid.UUID(str(job_id))
                for job_id in found]
    jobs = [dataclasses.replace(job, job_id=uuid.uuid4()) if job.job_id is SERVER_MADE_ID
            else job for job in jobs]
    with translating(alias), transaction.atomic(using=alias):
        return _enqueue_after_many_portable(jobs, alias, ttl)


def _after_row(job: PreparedJob) -> dict[str, Any]:
    """One element of ``soniq_enqueue_after_many``'s array."""
    row = job.as_json_row()
    row["depends_on"] = [str(dep) for dep in job.depends_on or ()]
    if job.any_outcome:
        row["any_outcome"] = True
    return row


def _chunks(ids: list[uuid.UUID]) -> list[list[uuid.UUID]]:
    return [ids[n:n + _SQLITE_CHUNK] for n in range(0, len(ids), _SQLITE_CHUNK)]


def _outside_states(outside: list[uuid.UUID], alias: str) -> dict[uuid.UUID, str]:
    """Mark the jobs outside the list (the first write: it takes SQLite's lock), then their
    dependency states; ``UNKNOWN_DEPENDENCY`` when one is in neither job table."""
    jobs = Job.objects.using(alias)
    for chunk in _chunks(outside):
        jobs.filter(id__in=chunk, status__in=[JobStatus.QUEUED, JobStatus.PROCESSING]).exclude(
            has_dependents=True).update(has_dependents=True)
    states: dict[uuid.UUID, str] = {}
    for chunk in _chunks(outside):
        for dep, status in jobs.filter(id__in=chunk).values_list("id", "status"):
            states[dep] = (_DONE if status == JobStatus.DONE
                           else _WAITING
                           if status in (JobStatus.QUEUED, JobStatus.PROCESSING)
                           else _FAILED)
    missing = [dep for dep in outside if dep not in states]
    for chunk in _chunks(missing):
        for dep in DeadLetterJob.objects.using(alias).filter(id__in=chunk).values_list(
                "id", flat=True):
            states[dep] = _FAILED
    if len(states) < len(outside):
        raise _unknown_dependency()
    return states


def _enqueue_after_many_portable(jobs: list[PreparedJob], alias: str, ttl: float
                                 ) -> list[uuid.UUID]:
    """``soniq_enqueue_after_many`` for SQLite: the same steps, a few statements in all."""
    from .api import _insert_many_portable

    first: dict[uuid.UUID, int] = {}
    for index, job in enumerate(jobs):
        first.setdefault(job.job_id, index)
    # Edges: (element, dependency, the earlier element it names or None).
    edges = [(index, dep, src if src is not None and src < index else None)
             for index, job in enumerate(jobs) for dep in job.depends_on or ()
             for src in [first.get(dep)]]
    outside = list(dict.fromkeys(dep for _, dep, src in edges if src is None))
    outside_state = _outside_states(outside, alias)
    # Edges inside point back: one pass in order settles who is cancelled at once.
    failed_by: list[uuid.UUID | None] = [None] * len(jobs)
    pending = [0] * len(jobs)
    states: list[str] = []
    for index, dep, src in edges:
        state = outside_state[dep] if src is None else (
            _FAILED if failed_by[src] is not None else _WAITING)
        states.append(state)
        if state == _WAITING:
            pending[index] += 1
        elif (state == _FAILED and not jobs[index].any_outcome
              and failed_by[index] is None):
            failed_by[index] = dep
    held = [dataclasses.replace(job, scheduled_at=WAITING_SCHEDULED_AT)
            if pending[index] or failed_by[index] is not None else job
            for index, job in enumerate(jobs)]
    found = _insert_many_portable(held, alias)
    written = [found[index] == job.job_id for index, job in enumerate(jobs)]
    if any(src is not None and not written[src] for _, _, src in edges):
        raise _unknown_dependency()  # it names a job an equal queued one stood in for
    named = list({jobs[src].job_id for _, _, src in edges
                  if src is not None and failed_by[src] is None})
    for chunk in _chunks(named):
        Job.objects.using(alias).filter(id__in=chunk).update(has_dependents=True)
    JobDependency.objects.using(alias).bulk_create([
        JobDependency(job_id=jobs[index].job_id, depends_on=dep,
                      any_outcome=jobs[index].any_outcome, state=state)
        for (index, dep, _), state in zip(edges, states) if written[index]])
    now = timezone.now()
    for index, failed in enumerate(failed_by):  # rare: a dependency already failed
        if failed is not None and written[index]:
            Job.objects.using(alias).filter(id=jobs[index].job_id).update(
                status=JobStatus.CANCELLED, last_error=f"dependency_failed:{failed}",
                scheduled_at=jobs[index].scheduled_at,
                expires_at=now + dt.timedelta(seconds=ttl), updated_at=now)
    JobWait.objects.using(alias).bulk_create([
        JobWait(job_id=job.job_id, pending=pending[index], run_at=job.scheduled_at,
                created_at=now)
        for index, job in enumerate(jobs)
        if written[index] and pending[index] and failed_by[index] is None])
    return found
