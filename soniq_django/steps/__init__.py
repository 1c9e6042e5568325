"""Durable steps: a job resumes after the steps an earlier run recorded (docs/steps.md).

``current_job().step(name, fn, *args, atomic=False, **kwargs)`` (run.py)
records each step's JSON result in ``soniq_job_steps`` (store.py, through
the fenced functions of sql/steps_v1.sql); a later run of the job returns
it without calling ``fn``. ``recorded_steps`` lists a job's records (the
admin's job page, ``JobInfo.steps``); ``reset_steps`` forgets them, so that
a replayed or retried job runs its steps again.
"""

import datetime as dt
import uuid
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, transaction

from ..errors import SoniqError, ErrorCode, translating


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One recorded step: its name, when, by which attempt and claim generation, its size."""

    name: str
    recorded_at: dt.datetime
    attempt: int
    generation: int
    size: int


def recorded_steps(job_id: uuid.UUID | str, using: str = DEFAULT_DB_ALIAS, *,
                   limit: int | None = None) -> list[StepRecord]:
    """The steps recorded for ``job_id``, in the order they were recorded (never their results).

    ``limit``: the first that many at most (one read of that many rows).
    """
    from ..models import JobStep

    with translating(using):
        rows = (JobStep.objects.using(using).filter(job_id=uuid.UUID(str(job_id)))
                .order_by("recorded_at", "name")
                .values_list("name", "recorded_at", "attempt", "generation", "size"))
        if limit is not None:
            rows = rows[:limit]
        return [StepRecord(name=n, recorded_at=at, attempt=a, generation=g, size=s)
                for n, at, a, g, s in rows]


def count_steps(job_id: uuid.UUID | str, using: str = DEFAULT_DB_ALIAS) -> int:
    """How many steps are recorded for ``job_id``."""
    from ..models import JobStep

    with translating(using):
        return int(JobStep.objects.using(using).filter(job_id=uuid.UUID(str(job_id))).count())


def reset_steps(job_id: uuid.UUID | str, names: "list[str] | None" = None, *,
                using: str = DEFAULT_DB_ALIAS) -> int:
    """Forget ``job_id``'s recorded steps (``names``: only those); return how many went.

    The job's next run calls those steps' functions again. Refused
    (QUEUE_SUBMISSION_CONFLICT) while the job is running: its row is locked
    and read first, so a run cannot begin or record meanwhile.
    """
    from ..models import Job, JobStatus, JobStep

    key = uuid.UUID(str(job_id))
    with translating(using), transaction.atomic(using=using):
        status = (Job.objects.using(using).select_for_update().filter(id=key)
                  .values_list("status", flat=True).first())
        if status == JobStatus.PROCESSING:
            raise SoniqError(ErrorCode.QUEUE_SUBMISSION_CONFLICT,
                             "the job is running: reset its steps once it has stopped")
        rows = JobStep.objects.using(using).filter(job_id=key)
        if names is not None:
            rows = rows.filter(name__in=list(names))
        deleted: int = rows.delete()[0]
        return deleted


__all__ = ["StepRecord", "recorded_steps", "reset_steps"]
