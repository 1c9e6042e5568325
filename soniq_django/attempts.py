"""A job's attempts: the recorded ones, and the one its row holds.

``soniq_job_attempts`` (sql/attempts_v1.sql) keeps each attempt that ended
without finishing its job -- failed and retried, lapsed, deferred, moved to
the dead letters -- written by a trigger in the transaction of the write
that ended it. The job's current attempt, or the one that finished it, is
its ``soniq_jobs`` row: ``claimed_at`` (set by every claim), ``worker_id``,
``claim_owner``, ``claim_generation`` and, once finished, ``updated_at``.
``job_attempts`` joins the two into one story, oldest first. See
docs/admin.md ("A job's attempts") and docs/decisions/0034-attempt-history.md.
"""

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS

from .models import DeadLetterJob, Job, JobAttempt, JobStatus


@dataclass(frozen=True)
class Attempt:
    """One attempt of a job.

    ``outcome`` is one of ``AttemptOutcome`` (failed, lapsed, deferred,
    dead) for a recorded attempt, else ``running``, ``done`` or
    ``cancelled`` for the one the job's row holds. ``claimed_at`` is None
    where no claim time was recorded (a claim made before migration 0020,
    or by a program that does not write it); ``ended_at`` None while running.
    """

    attempt: int
    generation: int
    outcome: str
    claimed_at: dt.datetime | None
    ended_at: dt.datetime | None
    worker_id: uuid.UUID | None
    claim_owner: str | None
    dead_letter_reason: str | None = None
    error: str | None = None

    @property
    def duration(self) -> dt.timedelta | None:
        """How long it ran (so far, for a running attempt: give ``now`` to ``ran_for``)."""
        if self.claimed_at is None or self.ended_at is None:
            return None
        return self.ended_at - self.claimed_at

    def ran_for(self, now: dt.datetime) -> dt.timedelta | None:
        """How long it ran, or has been running at ``now``."""
        if self.claimed_at is None:
            return None
        return (self.ended_at or now) - self.claimed_at


_ROW_OUTCOMES = {JobStatus.PROCESSING: "running", JobStatus.DONE: "done",
                 JobStatus.CANCELLED: "cancelled"}


def recorded_attempts(job_id: Any, using: str = DEFAULT_DB_ALIAS) -> list[Attempt]:
    """The recorded attempts of ``job_id``, oldest first (at most ``JobAttempt.KEPT_PER_JOB``)."""
    rows = JobAttempt.objects.using(using).filter(job_id=job_id).order_by("id")
    return [Attempt(row.attempt, row.generation, row.outcome, row.claimed_at, row.ended_at,
                    row.worker_id, row.claim_owner, row.dead_letter_reason, row.error)
            for row in rows]


def row_attempt(job: Job, recorded: list[Attempt]) -> Attempt | None:
    """The attempt ``job``'s row holds: running, or the one that finished it; else None.

    A row holds an attempt when it is processing, or finished by a claim
    that no recorded attempt ended: done, or cancelled while running. A job
    cancelled (or finished by hand) while queued holds none.
    """
    outcome = _ROW_OUTCOMES.get(JobStatus(job.status)) if job.status in JobStatus.values else None
    if outcome is None or (job.claim_generation == 0 and job.attempts == 0):
        return None
    if recorded and job.claim_generation <= recorded[-1].generation and job.claim_generation:
        return None  # its last claim is already told: it ended before this status
    if outcome == "cancelled" and job.claimed_at is None and job.lease_expires_at is None:
        return None  # cancelled while queued (or by a program that keeps no claim time)
    ended = None if outcome == "running" else job.updated_at
    return Attempt(job.attempts, job.claim_generation, outcome, job.claimed_at, ended,
                   job.worker_id, job.claim_owner,
                   error=job.last_error if outcome == "cancelled" else None)


def job_attempts(job: Job | DeadLetterJob | Any, using: str | None = None) -> list[Attempt]:
    """Every attempt of a job known to the database, oldest first.

    ``job`` is a ``Job`` row, a ``DeadLetterJob`` row (its attempts are all
    recorded) or a job id. For an id, the live row is read if there is one.
    """
    if isinstance(job, (Job, DeadLetterJob)):
        using = using or job._state.db or DEFAULT_DB_ALIAS
    else:
        using = using or DEFAULT_DB_ALIAS
        job = Job.objects.using(using).filter(id=job).first() or job
    job_id = job.id if isinstance(job, (Job, DeadLetterJob)) else job
    recorded = recorded_attempts(job_id, using)
    if isinstance(job, Job):
        current = row_attempt(job, recorded)
        if current is not None:
            recorded.append(current)
    return recorded
