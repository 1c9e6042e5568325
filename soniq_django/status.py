"""A summary of the queues for ``manage.py soniq_status``: the dashboard's numbers as plain data."""

from .dashboard import STATUS_COLUMNS, snapshot

STATUSES = list(STATUS_COLUMNS)


def queue_summary(using: str = "default") -> dict:
    """Counts per queue and status, oldest due job's wait, dead letters by reason, live workers."""
    view = snapshot(using)
    return {
        "queues": {row.queue: dict(row.cells) for row in view.queues},
        "oldest_queued_seconds": {
            row.queue: round(row.oldest_wait.total_seconds(), 3)
            for row in view.queues if row.oldest_wait is not None
        },
        "dead_letters_by_reason": dict(view.dead_letters_by_reason),
        "live_workers": len(view.live_workers),
    }
