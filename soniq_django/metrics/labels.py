"""Bounded label values: a series never has more than a few hundred label sets.

Queue names and worker ids come from outside (any producer may name a
queue), and every distinct value of a label is a new series that
Prometheus keeps. So:

- ``FirstSeen``: a process's counters keep the first ``limit`` distinct
  values they see (``SONIQ["METRICS_MAX_QUEUES"]`` queues, ``MAX_WORKER_IDS``
  worker ids); every later value is counted under ``OTHER``;
- ``reason``: a dead-letter reason soniq does not know is counted as ``other``;
- the queue-level series fold the queues past the first ``limit`` by name
  into ``OTHER`` (queues.py, ``bounded``).
"""

import threading
from collections.abc import Callable

from ..conf import get_settings
from ..models import DeadLetterReason

OTHER = "__other__"
"""The label value of every queue (or worker id) past the limit."""
MAX_WORKER_IDS = 16
"""The most worker ids one process labels its heartbeats with (one, in a worker process)."""
OTHER_REASON = "other"


class FirstSeen:
    """Keeps the first ``limit()`` distinct values it is given; later ones become ``OTHER``."""

    def __init__(self, limit: Callable[[], int]):
        self._limit = limit
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._kept:
            return value
        with self._lock:
            if value in self._kept or len(self._kept) < self._limit():
                self._kept.add(value)
                return value
        return OTHER


def max_queues() -> int:
    """``SONIQ["METRICS_MAX_QUEUES"]``, or its default when the value is not a whole number."""
    value = get_settings().METRICS_MAX_QUEUES
    return value if type(value) is int and value >= 1 else 100


def reason(value: str | None) -> str:
    """A dead-letter reason as a label: one of soniq's reasons, else ``other``."""
    return value if value is not None and value in DeadLetterReason.values else OTHER_REASON
