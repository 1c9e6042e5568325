"""Operator actions on jobs and schedules: what the admin and commands call.

Each function does one checked change in one transaction and returns what
it did. They never touch a running job's fence: cancelling a running job
only *asks* its worker to stop.
"""

import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connections, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from .models import WAITING_SCHEDULED_AT, Job, JobStatus, RecurringJob, ScheduleStatus
from .owned import OwnedJobSource
from .owned._store import fenced_writes, take_sqlite_write_lock

PROTECTED = Q(fence_required=True) | Q(submission_id__isnull=False)

#: How many leading hex digits of a job id the admin shows, and the shortest
#: prefix the commands (``soniq_replay``, ``soniq_cancel``) accept.
SHORT_ID_LENGTH = 8

_HEX = re.compile(r"[0-9a-f]*")
_GROUPS = (8, 4, 4, 4, 12)

CANCELLED = "cancelled"
REQUESTED = "requested"
SKIPPED = "skipped"


def short_id(job_id: uuid.UUID) -> str:
    """The id as the admin lists it: its first ``SHORT_ID_LENGTH`` hex digits."""
    return str(job_id)[:SHORT_ID_LENGTH]


def id_bounds(text: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The smallest and largest id that ``text`` can stand for, or None if it names none.

    ``text`` is a whole id (any spelling ``uuid.UUID`` reads) or the start of
    one as the admin shows ids: at least ``SHORT_ID_LENGTH`` hex digits, with
    or without the hyphens in their places. A whole id is its own bounds.
    """
    text = text.strip().lower()
    try:
        whole = uuid.UUID(text)
    except ValueError:
        pass
    else:
        return whole, whole
    digits = text.replace("-", "")
    if not SHORT_ID_LENGTH <= len(digits) <= 32 or _HEX.fullmatch(digits) is None:
        return None
    if "-" in text and text != _hyphenated(digits)[:len(text)]:
        return None  # hyphens out of their places
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def _hyphenated(digits: str) -> str:
    parts, start = [], 0
    for size in _GROUPS:
        parts.append(digits[start:start + size])
        start += size
    return "-".join(parts)


@dataclass(frozen=True)
class IdMatch:
    """What one id or prefix given by an operator matches among some rows."""

    text: str
    ids: tuple[uuid.UUID, ...]  # at most two: enough to tell "one" from "ambiguous"
    count: int  # how many rows match in all
    valid: bool  # False: the text is neither an id nor a long enough prefix

    @property
    def job_id(self) -> uuid.UUID | None:
        """The one id matched, or None (unknown, ambiguous or invalid)."""
        return self.ids[0] if self.count == 1 else None


def match_ids(rows: QuerySet, texts: Iterable[str]) -> list[IdMatch]:
    """Which rows of ``rows`` each of ``texts`` (whole ids or prefixes) stands for.

    A prefix is looked up as a range of ids, so the primary key's index
    serves it on both databases (ids order as their hex digits do).
    """
    found = []
    for text in texts:
        bounds = id_bounds(text)
        if bounds is None:
            found.append(IdMatch(text, (), 0, valid=False))
            continue
        matching = rows.filter(id__gte=bounds[0], id__lte=bounds[1])
        ids = tuple(matching.order_by("id").values_list("id", flat=True)[:2])
        count = len(ids) if len(ids) < 2 else matching.count()
        found.append(IdMatch(text, ids, count, valid=True))
    return found


@dataclass(frozen=True)
class CancelReport:
    cancelled: int  # cancelled at once: were queued, or running with a lapsed lease
    requested: int  # running with a live lease: their workers were asked to stop
    skipped: int  # missing or already finished
    outcomes: tuple[tuple[uuid.UUID, str], ...] = ()
    """Each job id with what happened to it: ``cancelled``, ``requested`` or ``skipped``."""


def cancel_jobs(job_ids: Iterable[uuid.UUID], *, using: str = "default") -> CancelReport:
    """Cancel queued jobs and request cancellation of running ones.

    What happened to each job is read from its row afterwards: a running job
    whose lease had lapsed is cancelled at once, not asked to stop.
    """
    source = OwnedJobSource(using)
    outcomes = []
    for job_id in job_ids:
        if not source.request_cancel(job_id):
            outcomes.append((job_id, SKIPPED))
            continue
        status = Job.objects.using(using).filter(id=job_id).values_list("status", flat=True).first()
        outcomes.append((job_id, REQUESTED if status == JobStatus.PROCESSING else CANCELLED))
    counts = {kind: sum(1 for _, outcome in outcomes if outcome == kind)
              for kind in (CANCELLED, REQUESTED, SKIPPED)}
    return CancelReport(counts[CANCELLED], counts[REQUESTED], counts[SKIPPED], tuple(outcomes))


def retry_now(job_ids: Iterable[uuid.UUID], *, using: str = "default") -> int:
    """Make queued jobs that wait for a later time (a backoff, run_at) eligible now.

    Returns how many jobs changed; jobs in any other state are left alone, and so are
    jobs that wait for their dependencies (docs/workflows.md): no write makes them due.
    """
    return len(retry_now_ids(job_ids, using=using))


def retry_now_ids(job_ids: Iterable[uuid.UUID], *, using: str = "default") -> list[uuid.UUID]:
    """``retry_now``, returning the ids of the jobs it made due (what the admin logs).

    The waiting jobs are locked (PostgreSQL) or the write lock is taken
    (SQLite) before they are read, and "now" is read after that lock: a
    job another call made due meanwhile no longer waits, so every id
    returned is one this call changed.
    """
    connection = connections[using]
    with fenced_writes(connection):
        if connection.vendor == "sqlite":
            take_sqlite_write_lock(connection)
        waiting = list(Job.objects.using(using).filter(
            id__in=list(job_ids), status=JobStatus.QUEUED, scheduled_at__gt=timezone.now(),
            scheduled_at__lt=WAITING_SCHEDULED_AT,
        ).select_for_update().values_list("id", "scheduled_at"))
        now = timezone.now()
        changed = [job_id for job_id, scheduled_at in waiting if scheduled_at > now]
        if changed:
            Job.objects.using(using).filter(id__in=changed).update(
                scheduled_at=now, updated_at=now)
        return changed


def delete_finished(job_ids: Iterable[uuid.UUID], *, using: str = "default") -> int:
    """Delete done or cancelled jobs; never queued, running or protected owned ones."""
    return len(delete_finished_rows(job_ids, using=using))


def delete_finished_rows(job_ids: Iterable[uuid.UUID], *, using: str = "default") -> list[Job]:
    """``delete_finished``, returning the rows it deleted (what the admin logs).

    Each row has its ``id``, ``job_name`` and ``status`` loaded (what its
    ``str()`` shows), read under the same lock as the delete.
    """
    connection = connections[using]
    with transaction.atomic(using=using):
        if connection.vendor == "sqlite":
            take_sqlite_write_lock(connection)
        finished = list(Job.objects.using(using).filter(
            id__in=list(job_ids), status__in=[JobStatus.DONE, JobStatus.CANCELLED]
        ).exclude(PROTECTED).select_for_update().only("id", "job_name", "status"))
        if finished:
            Job.objects.using(using).filter(id__in=[job.id for job in finished]).delete()
        return finished


def set_schedule_status(schedule_ids: Iterable[uuid.UUID], status: str, *,
                        using: str = "default") -> int:
    """Pause or resume recurring jobs; returns how many changed."""
    return len(set_schedule_status_ids(schedule_ids, status, using=using))


def set_schedule_status_ids(schedule_ids: Iterable[uuid.UUID], status: str, *,
                            using: str = "default") -> list[uuid.UUID]:
    """``set_schedule_status``, returning the ids of the schedules it changed."""
    if status not in ScheduleStatus.values:
        raise ValueError("status must be 'active' or 'paused'")
    connection = connections[using]
    with transaction.atomic(using=using):
        if connection.vendor == "sqlite":
            take_sqlite_write_lock(connection)
        changed = list(RecurringJob.objects.using(using).filter(
            id__in=list(schedule_ids)).exclude(status=status)
            .select_for_update().values_list("id", flat=True))
        if changed:
            RecurringJob.objects.using(using).filter(id__in=changed).update(status=status)
        return changed
