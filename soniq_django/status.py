"""A summary of the queues for ``manage.py soniq_status``: the dashboard's numbers as plain data."""

from collections import Counter

from .dashboard import STATUS_COLUMNS, snapshot

STATUSES = list(STATUS_COLUMNS)
UNKNOWN_VERSION = "unknown"
"""How a live worker that wrote no ``version`` is counted (Soniq 0.1.0's workers write none)."""


def queue_summary(using: str = "default") -> dict:
    """Counts per queue and status, oldest due job's wait, dead letters by reason, live workers.

    ``live_workers_by_version`` tells the kinds of worker apart while a
    database is shared with Soniq's own workers (docs/interop.md).
    """
    view = snapshot(using)
    return {
        "queues": {row.queue: dict(row.cells) for row in view.queues},
        "oldest_queued_seconds": {
            row.queue: round(row.oldest_wait.total_seconds(), 3)
            for row in view.queues if row.oldest_wait is not None
        },
        "dead_letters_by_reason": dict(view.dead_letters_by_reason),
        "live_workers": len(view.live_workers),
        "live_workers_by_version": dict(sorted(Counter(
            worker.version or UNKNOWN_VERSION for worker in view.live_workers).items())),
    }
