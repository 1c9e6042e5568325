"""Owned submissions: a caller-known identity, a fingerprint, replay forever.

``snapshot`` runs before any I/O: it checks the request, copies its args and
computes the versioned fingerprint, so later changes to the caller's objects
cannot change what is submitted. ``submit`` then inserts the job -- or, when
the submission id is already known, returns the original job id if the
fingerprint matches and raises QUEUE_SUBMISSION_CONFLICT if it does not.
"""

import datetime as dt
import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from ..conf import get_settings
from ..encoding import canonical_json
from ..errors import ConfigValidationError, ErrorCode, SettingsInvalid, SoniqError
from ..producer.request import JobRequest, PreparedJob, prepare
from ..models import DeadLetterJob, Job, JobStatus
from ._store import fenced_writes, guarded, take_sqlite_write_lock
from .types import INT32_MAX, identity, positive_int

FINGERPRINT_VERSION = "v1"
SUBMISSION_TABLE = "soniq_jobs"


@dataclass(frozen=True)
class OwnedSubmission:
    """What ``submit`` writes: the validated job plus its owned identity."""

    job: PreparedJob
    submission_id: str
    fingerprint: str
    active_key: str | None
    force: bool


def conflict(reason: str) -> SoniqError:
    return SoniqError(ErrorCode.QUEUE_SUBMISSION_CONFLICT, reason)


def _utc_text(value: dt.datetime | None) -> str | None:
    """An aware datetime as UTC with six fractional digits; equal instants match."""
    if value is None:
        return None
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def fingerprint(request: JobRequest, submission_id: str, args: dict[str, Any] | None) -> str:
    """The versioned SHA-256 fingerprint of an owned submission.

    It covers the table, the submission id and every authored field as
    authored: None stays null (None and {} differ), an explicit job_id keeps
    its spelling, run_at is normalised to UTC. Nothing the database assigns
    (generated ids, default queue, enqueue time) enters it.
    """
    job_id = request.job_id
    authored = {
        "job_name": request.job_name,
        "args": args,
        "queue": request.queue,
        "priority": request.priority,
        # A datetime or None: snapshot() refused a countdown (a timedelta) before.
        "run_at": _utc_text(request.run_at),  # type: ignore[arg-type]
        "max_attempts": request.max_attempts,
        "unique_job": request.unique_job,
        "dedup_key": request.dedup_key,
        "producer_id": request.producer_id,
        "job_id": str(job_id) if isinstance(job_id, uuid.UUID) else job_id,
        "active_key": request.active_key,
    }
    document = {
        "version": FINGERPRINT_VERSION,
        "table": SUBMISSION_TABLE,
        "submission_id": submission_id,
        "request": authored,
    }
    digest = hashlib.sha256(canonical_json(document).encode("utf-8")).hexdigest()
    return f"{FINGERPRINT_VERSION}:{digest}"


def snapshot(request: object, submission_id: object, force: object) -> OwnedSubmission:
    """Validate and freeze an owned submission; raises ConfigValidationError (CONFIG)."""
    if type(request) is not JobRequest:
        raise ConfigValidationError("submit_owned expects a JobRequest")
    submission_id = identity(submission_id, "submission_id")
    if type(force) is not bool:
        raise ConfigValidationError("force must be True or False")
    positive_int(request.max_attempts, "max_attempts", INT32_MAX)
    if request.active_key is not None:
        identity(request.active_key, "active_key")
    if request.delay is not None or isinstance(request.run_at, dt.timedelta):
        # The fingerprint covers what was authored; a countdown would be
        # counted anew by each replay of the same submission.
        raise ConfigValidationError(
            "submit_owned needs run_at as an aware datetime: a countdown (delay=, or a "
            "timedelta) is not a replayable part of a submission")
    try:
        job = prepare(request)
    except SettingsInvalid:
        raise  # the project's settings, not the request, are wrong
    except SoniqError as error:
        raise ConfigValidationError(f"{error.code.value}: {error.reason}") from None
    args = None if request.args is None else job.args
    return OwnedSubmission(
        job=job,
        submission_id=submission_id,
        fingerprint=fingerprint(request, submission_id, args),
        active_key=request.active_key,
        force=force,
    )


def _replayed(alias: str, submission: OwnedSubmission) -> uuid.UUID | None:
    """The original id when this submission id is known; conflict if it differs."""
    for model in (Job, DeadLetterJob):
        found = (
            model.objects.using(alias)
            .filter(submission_id=submission.submission_id)
            .values_list("id", "submission_id", "submission_fingerprint")
            .first()
        )
        if found is None or found[1] != submission.submission_id:
            continue
        if found[2] != submission.fingerprint:
            raise conflict("submission_mismatch")
        job_id: uuid.UUID = found[0]
        return job_id
    return None


def _row(submission: OwnedSubmission) -> Job:
    job = submission.job
    return Job(
        id=job.job_id, job_name=job.job_name, args=job.args, args_hash=job.args_hash,
        status=JobStatus.QUEUED, attempts=0, max_attempts=job.max_attempts, queue=job.queue,
        priority=job.priority, unique_job=job.unique_job, dedup_key=job.dedup_key,
        scheduled_at=job.scheduled_at, producer_id=job.producer_id, fence_required=True,
        submission_id=submission.submission_id, submission_fingerprint=submission.fingerprint,
        active_key=submission.active_key,
    )


def _displace_predecessor(alias: str, connection: Any, submission: OwnedSubmission,
                          now: dt.datetime) -> uuid.UUID | None:
    """Cancel a live job holding the same active key (``force``), or refuse.

    Returns the original id when, under the predecessor's lock, this turns
    out to be a replay after all; None when the new job may be inserted.
    """
    jobs = Job.objects.using(alias)
    predecessor = (
        jobs.select_for_update()
        .filter(active_key=submission.active_key, status__in=[JobStatus.QUEUED, JobStatus.PROCESSING])
        .first()
    )
    if predecessor is None:
        return None
    # Re-check replay under the predecessor's lock: an identical request may
    # have committed since the first look.
    replayed = _replayed(alias, submission)
    if replayed is not None:
        return replayed
    if not predecessor.fence_required:
        raise conflict("legacy_active_key")
    if not submission.force:
        raise conflict("active_key_in_use")
    with fenced_writes(connection):
        jobs.filter(id=predecessor.id).update(
            status=JobStatus.CANCELLED, lease_expires_at=None, pid=None,
            # Kept for RESULT_TTL like every cancelled row: whoever asks sees what happened.
            expires_at=now + dt.timedelta(seconds=float(get_settings().RESULT_TTL)),
            updated_at=now,
        )
    return None


def submit(alias: str, submission: OwnedSubmission) -> uuid.UUID:
    """Insert an owned submission, or return the original id of an exact replay.

    Raises QUEUE_SUBMISSION_CONFLICT for changed content under a known
    submission id, a job id already used by another row, an active key held
    by a live job (without ``force``, or by a legacy job), or a colliding
    dedup/unique job; QUEUE_PERSISTENCE_FAILED when the database fails.
    """
    with guarded(alias, atomic=True) as connection:
        if connection.vendor == "sqlite":
            take_sqlite_write_lock(connection)
        replayed = _replayed(alias, submission)
        if replayed is not None:
            return replayed
        job = submission.job
        if not job.job_id_generated and (
            Job.objects.using(alias).filter(id=job.job_id).exists()
            or DeadLetterJob.objects.using(alias).filter(id=job.job_id).exists()
        ):
            raise conflict("job_id_in_use")
        if submission.active_key is not None:
            replayed = _displace_predecessor(alias, connection, submission, timezone.now())
            if replayed is not None:
                return replayed
        try:
            with transaction.atomic(using=alias):
                _row(submission).save(using=alias, force_insert=True)
        except IntegrityError:
            replayed = _replayed(alias, submission)
            if replayed is not None:
                return replayed
            raise conflict("collision") from None
        if connection.vendor == "postgresql" and (
            job.scheduled_at is None or job.scheduled_at <= timezone.now()
        ):
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_notify('soniq_new_job', %s)", [job.queue])
    return job.job_id
