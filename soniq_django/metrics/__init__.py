"""Prometheus metrics of soniq_django (the ``prometheus`` extra: ``prometheus_client``).

- ``queues.py``: the queue-level series, read from the database in one
  query at each scrape, so any process can serve them;
- ``process.py``: this process's counters and run-time histogram, fed by
  the signals of ``soniq_django.signals``;
- ``worker.py``: a worker's own series, and its exposition (a port of its
  own, or node_exporter's textfile collector) behind ``soniq_worker
  --metrics-port`` / ``--metrics-textfile``;
- ``view.py``: ``metrics_view``, the Django view a web process serves them from.

Every series is listed in docs/metrics.md. Importing this package without
prometheus_client raises ``ExtraNotInstalled`` (an ``ImportError``).
"""

from ..errors import ExtraNotInstalled

try:
    import prometheus_client  # noqa: F401
except ImportError:
    raise ExtraNotInstalled("prometheus_client", "prometheus", "soniq_django.metrics") from None

from .process import process_collectors  # noqa: E402
from .queues import QueueCollector, QueueFigures, read_queues  # noqa: E402
from .view import metrics_view  # noqa: E402
from .worker import WorkerCollector, exposed  # noqa: E402

__all__ = ["QueueCollector", "QueueFigures", "WorkerCollector", "exposed", "metrics_view",
           "process_collectors", "read_queues"]
