"""A summary of the queues for ``manage.py soniq_status`` (and anyone else)."""

import datetime as dt

from django.db.models import Count, Min
from django.utils import timezone

from .models import DeadLetterJob, Job, JobStatus, Worker, WorkerState

STATUSES = [*JobStatus.values, "dead_letter"]


def queue_summary(using: str = "default") -> dict:
    """Counts per queue and status, oldest queued age, dead letters by reason, live workers."""
    queues: dict[str, dict] = {}
    for row in Job.objects.using(using).values("queue", "status").annotate(n=Count("id")):
        queues.setdefault(row["queue"], dict.fromkeys(STATUSES, 0))[row["status"]] = row["n"]
    for row in DeadLetterJob.objects.using(using).values("queue").annotate(n=Count("id")):
        queues.setdefault(row["queue"], dict.fromkeys(STATUSES, 0))["dead_letter"] = row["n"]
    now = timezone.now()
    oldest = {
        row["queue"]: (now - row["oldest"]).total_seconds()
        for row in Job.objects.using(using).filter(status=JobStatus.QUEUED)
        .values("queue").annotate(oldest=Min("created_at"))
    }
    reasons = {
        row["dead_letter_reason"]: row["n"]
        for row in DeadLetterJob.objects.using(using).values("dead_letter_reason")
        .annotate(n=Count("id"))
    }
    recent = now - dt.timedelta(seconds=60)
    workers = Worker.objects.using(using).filter(
        status__in=[WorkerState.RUNNING, WorkerState.STOPPING], last_heartbeat_at__gte=recent
    ).count()
    return {
        "queues": {name: queues[name] for name in sorted(queues)},
        "oldest_queued_seconds": {name: round(oldest[name], 3) for name in sorted(oldest)},
        "dead_letters_by_reason": dict(sorted(reasons.items())),
        "live_workers": workers,
    }
