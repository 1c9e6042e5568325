"""Reviewed retirement of protected submissions.

An owned submission keeps its identity (``submission_id``, fingerprint and
``fence_required``) through every transition, so replay answers forever and
the controlled downgrade refuses while any is retained. Retirement is the one
way to remove that identity: only from terminal rows (``done`` and
``cancelled`` jobs, dead letters) last changed before a cut-off, after an
operator has reviewed a dry run. Queued and processing rows are never touched.
"""

from dataclasses import dataclass
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Q
from django.utils import timezone

from .models import DeadLetterJob, Job, JobStatus
from .owned._store import fenced_writes

#: Rows fetched and cleared per transaction, so no lock is held for long.
BATCH_SIZE = 500

_PROTECTED = Q(submission_id__isnull=False) | Q(fence_required=True)
_CLEARED = {"submission_id": None, "submission_fingerprint": None, "fence_required": False}


@dataclass(frozen=True, kw_only=True)
class RetirementGroup:
    """Protected rows of one table and status (``dead_letter`` for the dead letters)."""

    table: str
    status: str
    rows: int
    eligible: bool
    """False for queued and processing jobs, which retirement never touches."""


def _groups(cutoff: datetime) -> tuple[tuple[str, str, Any, Any], ...]:
    """(table, status, model, eligible queryset) for each terminal group."""
    return (
        ("soniq_jobs", JobStatus.DONE, Job,
         Job.objects.filter(_PROTECTED, status=JobStatus.DONE, updated_at__lt=cutoff)),
        ("soniq_jobs", JobStatus.CANCELLED, Job,
         Job.objects.filter(_PROTECTED, status=JobStatus.CANCELLED, updated_at__lt=cutoff)),
        ("soniq_dead_letter_jobs", "dead_letter", DeadLetterJob,
         DeadLetterJob.objects.filter(_PROTECTED, moved_to_dead_letter_at__lt=cutoff)),
    )


def cutoff_for(older_than: timedelta) -> datetime:
    """The instant before which a row's last change must lie to be retired."""
    if older_than < timedelta(0):
        raise ValueError("the age must not be negative")
    cutoff: datetime = timezone.now() - older_than
    return cutoff


def count_retirable(cutoff: datetime, *, using: str = "default") -> list[RetirementGroup]:
    """What a retirement at ``cutoff`` would clear, per table and status, plus the live
    protected jobs it never clears (``eligible=False``). Changes nothing."""
    groups = [RetirementGroup(table=table, status=str(status), rows=qs.using(using).count(),
                              eligible=True)
              for table, status, _model, qs in _groups(cutoff)]
    for status in (JobStatus.QUEUED, JobStatus.PROCESSING):
        rows = Job.objects.using(using).filter(_PROTECTED, status=status).count()
        groups.append(RetirementGroup(table="soniq_jobs", status=str(status), rows=rows,
                                      eligible=False))
    return groups


def retire_submissions(cutoff: datetime, *, using: str = "default",
                       batch_size: int = BATCH_SIZE,
                       progress: Callable[[str, str, int, int], object] | None = None,
                       ) -> list[RetirementGroup]:
    """Clear the submission identity of terminal rows last changed before ``cutoff``.

    Works in batches, one transaction each; ``progress(table, status, done, total)``
    is called after each batch. Returns how many rows each group had cleared.
    Database errors propagate (a batch already committed stays retired).
    """
    retired: list[RetirementGroup] = []
    for table, status, model, queryset in _groups(cutoff):
        total, done = queryset.using(using).count(), 0
        while True:
            cleared = _retire_batch(model, queryset, using, batch_size)
            if not cleared:
                break
            done += cleared
            if progress is not None:
                progress(table, str(status), done, max(total, done))
        retired.append(RetirementGroup(table=table, status=str(status), rows=done, eligible=True))
    return retired


def _retire_batch(model: Any, queryset: Any, using: str, batch_size: int) -> int:
    """Clear one batch; returns how many rows changed (0 when none is left)."""
    with transaction.atomic(using=using):
        ids = list(queryset.using(using).values_list("pk", flat=True)[:batch_size])
        if not ids:
            return 0
        # The filter is applied again in the UPDATE: a row that changed since
        # it was selected (a replayed dead letter, say) is left alone.
        with fenced_writes(connections[using]):
            cleared: int = queryset.using(using).filter(pk__in=ids).update(**_CLEARED)
    return cleared
