"""What a burst worker leaves queued when it exits: one read, for its last log line.

A burst worker exits once a claim finds nothing it may start, which is not
"no job is left": jobs waiting for a later time (a retry's backoff, a
``run_at``, a deferral) and the jobs of paused queues stay queued. Its last
line counts them, so that an empty-looking exit does not hide them.
"""

from dataclasses import dataclass

from django.db.models import Count, Q

from ..models import Job, JobStatus, QueueSetting
from ..overview import database_time
from ..owned._store import guarded


@dataclass(frozen=True)
class Left:
    """Queued jobs of some queues that a burst worker did not run."""

    waiting: int
    """Due later (a retry's backoff, a ``run_at``, a deferral), in queues that are not paused."""
    paused: int
    """In paused queues, due or not."""

    def note(self) -> str:
        """The words a last log line adds; '' when nothing was left."""
        parts = []
        if self.waiting:
            parts.append(f"{self.waiting} waiting for a later time (a retry's backoff, a "
                         "run_at or a deferral)")
        if self.paused:
            parts.append(f"{self.paused} in paused queues")
        return f"; left queued: {', '.join(parts)}" if parts else ""


def left(using: str, queues: list[str] | None) -> Left:
    """The queued jobs of ``queues`` (None: every queue) that are not due now, or paused.

    Raises SoniqError when the database fails (``guarded``).
    """
    rows = Job.objects.using(using).filter(status=JobStatus.QUEUED)
    if queues is not None:
        rows = rows.filter(queue__in=queues)
    with guarded(using, atomic=False):
        paused = list(QueueSetting.objects.using(using).filter(paused=True).values_list(
            "queue", flat=True))
        if paused:
            in_paused = Q(queue__in=paused)
            counts = rows.aggregate(
                paused=Count("id", filter=in_paused),
                waiting=Count("id", filter=Q(scheduled_at__gt=database_time(using))
                              & ~in_paused))
        else:
            counts = rows.aggregate(
                waiting=Count("id", filter=Q(scheduled_at__gt=database_time(using))))
            counts["paused"] = 0
    return Left(waiting=counts["waiting"], paused=counts["paused"])
