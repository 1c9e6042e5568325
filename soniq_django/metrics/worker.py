"""A worker's own series, and how a worker exposes them: a port, or a textfile.

``soniq_worker --metrics-port PORT`` serves this process's counters
(process.py) and the worker's gauges below over HTTP from a thread of
prometheus_client; with ``--metrics-queues`` the queue-level series too, read
on a connection of the scrape's own, closed after it. ``--metrics-textfile
PATH`` writes the same process and worker series (never the queue-level
ones: the write runs on the heartbeat thread, which must not wait on a
query) for node_exporter's textfile collector, atomically (a temporary
file renamed over PATH): at start, at every heartbeat, and at exit.
"""

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, start_http_server, write_to_textfile
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import signals
from .process import process_collectors
from .queues import QueueCollector

if TYPE_CHECKING:
    from ..worker import Worker

logger = logging.getLogger("soniq_django.metrics")


class WorkerCollector(Collector):
    """One worker's gauges: the jobs it runs now, and its slots."""

    def __init__(self, worker: "Worker"):
        self.worker = worker

    def collect(self) -> Iterator[Metric]:
        worker_id = self.worker.worker_id
        in_flight = GaugeMetricFamily("soniq_worker_jobs_in_flight",
                                      "Jobs the worker is running now (claimed, not settled)",
                                      labels=["worker_id"])
        in_flight.add_metric([worker_id], len(self.worker.flights))
        slots = GaugeMetricFamily("soniq_worker_concurrency",
                                  "Jobs the worker runs at once (--concurrency)",
                                  labels=["worker_id"])
        slots.add_metric([worker_id], self.worker.concurrency)
        yield in_flight
        yield slots


def worker_registry(worker: "Worker", *, queues: bool = False) -> CollectorRegistry:
    """This process's series and ``worker``'s; with ``queues``, the queue-level ones too."""
    registry = CollectorRegistry()
    for collector in (*process_collectors(), WorkerCollector(worker)):
        registry.register(collector)
    if queues:
        registry.register(QueueCollector(worker.using, close_connection=True))
    return registry


class Textfile:
    """Writes a registry to ``path`` for node_exporter, at each heartbeat of one worker."""

    def __init__(self, path: str, registry: CollectorRegistry, worker_id: str):
        self.path = path
        self.registry = registry
        self.worker_id = worker_id
        self._failing = False
        self._lock = threading.Lock()

    def write(self) -> None:
        """Write the file now; a failure is logged once (until a write succeeds again)."""
        with self._lock:
            try:
                write_to_textfile(self.path, self.registry)
            except OSError as error:
                if not self._failing:
                    logger.warning("metrics: could not write the textfile (%s: %s)",
                                   type(error).__name__, error.strerror or "")
                self._failing = True
                return
            self._failing = False

    def on_heartbeat(self, **_: Any) -> None:
        self.write()


@contextmanager
def exposed(worker: "Worker", *, port: int | None = None, addr: str = "0.0.0.0",
            textfile: str | None = None, queues: bool = False) -> Iterator[None]:
    """While the block runs, serve ``worker``'s series on ``port`` and/or write ``textfile``.

    ``port`` 0 takes a free port; the log line says which.
    """
    server = None
    if port is not None:
        server, _ = start_http_server(port, addr, registry=worker_registry(worker, queues=queues))
        logger.info("metrics: serving http://%s:%d/metrics", addr, server.server_port)
    writer = None
    if textfile is not None:
        writer = Textfile(textfile, worker_registry(worker), worker.worker_id)
        writer.write()
        signals.worker_heartbeat.connect(writer.on_heartbeat, sender=worker.worker_id,
                                         weak=False, dispatch_uid=f"textfile:{worker.worker_id}")
        logger.info("metrics: writing %s at every heartbeat", textfile)
    try:
        yield
    finally:
        if writer is not None:
            signals.worker_heartbeat.disconnect(sender=worker.worker_id,
                                                dispatch_uid=f"textfile:{worker.worker_id}")
            writer.write()  # the final figures
        if server is not None:
            server.shutdown()
            server.server_close()
