"""Operator actions on jobs and schedules: what the admin and commands call.

Each function does one checked change in one transaction and returns what
it did. They never touch a running job's fence: cancelling a running job
only *asks* its worker to stop.
"""

import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connections
from django.db.models import Q
from django.utils import timezone

from .models import Job, JobStatus, RecurringJob, ScheduleStatus
from .owned import OwnedJobSource
from .owned._store import fenced_writes

PROTECTED = Q(fence_required=True) | Q(submission_id__isnull=False)


@dataclass(frozen=True)
class CancelReport:
    cancelled: int  # cancelled at once: were queued, or running with a lapsed lease
    requested: int  # running with a live lease: their workers were asked to stop
    skipped: int  # missing or already finished


def cancel_jobs(job_ids: Iterable[uuid.UUID], *, using: str = "default") -> CancelReport:
    """Cancel queued jobs and request cancellation of running ones.

    What happened to each job is read from its row afterwards: a running job
    whose lease had lapsed is cancelled at once, not asked to stop.
    """
    source = OwnedJobSource(using)
    cancelled = requested = skipped = 0
    for job_id in job_ids:
        if not source.request_cancel(job_id):
            skipped += 1
            continue
        status = Job.objects.using(using).filter(id=job_id).values_list("status", flat=True).first()
        if status == JobStatus.PROCESSING:
            requested += 1
        else:
            cancelled += 1
    return CancelReport(cancelled, requested, skipped)


def retry_now(job_ids: Iterable[uuid.UUID], *, using: str = "default") -> int:
    """Make queued jobs that wait for a later time (a backoff, run_at) eligible now.

    Returns how many jobs changed; jobs in any other state are left alone.
    """
    now = timezone.now()
    with fenced_writes(connections[using]):
        changed: int = Job.objects.using(using).filter(
            id__in=list(job_ids), status=JobStatus.QUEUED, scheduled_at__gt=now
        ).update(scheduled_at=now, updated_at=now)
        return changed


def delete_finished(job_ids: Iterable[uuid.UUID], *, using: str = "default") -> int:
    """Delete done or cancelled jobs; never queued, running or protected owned ones."""
    finished = Job.objects.using(using).filter(
        id__in=list(job_ids), status__in=[JobStatus.DONE, JobStatus.CANCELLED]
    ).exclude(PROTECTED)
    deleted: int
    deleted, _ = finished.delete()
    return deleted


def set_schedule_status(schedule_ids: Iterable[uuid.UUID], status: str, *,
                        using: str = "default") -> int:
    """Pause or resume recurring jobs; returns how many changed."""
    if status not in ScheduleStatus.values:
        raise ValueError("status must be 'active' or 'paused'")
    changed: int = RecurringJob.objects.using(using).filter(
        id__in=list(schedule_ids)).exclude(status=status).update(status=status)
    return changed
