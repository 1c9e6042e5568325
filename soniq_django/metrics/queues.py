"""The queue-level series: one query over soniq_jobs and soniq_dead_letter_jobs, at most
once per ``SONIQ["METRICS_CACHE_SECONDS"]`` per collector.

They describe the database, not a process, so every process that serves
them -- the web view, a worker asked to -- reports the same figures. A
read's figures are served again to every scrape within the cache time
(scrapes that arrive while a read runs wait for it), so however often the
view is asked, the tables are read at most once per that time per process;
``soniq_queue_metrics_age_seconds`` says how old the figures served are.
At most ``SONIQ["METRICS_MAX_QUEUES"]`` queues keep their own label (the
first by name); the others are summed as ``__other__`` (``bounded``).
"""

import datetime as dt
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from django.db import DatabaseError, connections
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..conf import get_settings
from ..errors import SoniqError
from ..models import DeadLetterJob, Job, JobStatus
from .labels import OTHER, max_queues, reason

logger = logging.getLogger("soniq_django.metrics")

#: One statement: per (queue, status) the jobs, the due ones, the oldest due job's start of
#: waiting and the lapsed leases; then per (queue, reason) the dead letters. A due job has
#: waited since it became due (scheduled_at) or was enqueued, whichever is later (as the
#: dashboard counts it, overview.py).
QUERY = """
SELECT 0, queue, status, COUNT(*),
       SUM(CASE WHEN status = 'queued' AND (scheduled_at IS NULL OR scheduled_at <= %(now)s)
           THEN 1 ELSE 0 END),
       MIN(CASE WHEN status = 'queued' AND (scheduled_at IS NULL OR scheduled_at <= %(now)s)
           THEN CASE WHEN scheduled_at > created_at THEN scheduled_at ELSE created_at END END),
       SUM(CASE WHEN status = 'processing' AND lease_expires_at < %(now)s THEN 1 ELSE 0 END)
  FROM {jobs} GROUP BY queue, status
UNION ALL
SELECT 1, queue, dead_letter_reason, COUNT(*), 0, NULL, 0
  FROM {dead} GROUP BY queue, dead_letter_reason
"""


@dataclass(frozen=True)
class QueueFigures:
    """What the query found; every queue with a row in either table is in ``queues``."""

    now: dt.datetime
    jobs: dict[tuple[str, str], int] = field(default_factory=dict)
    """(queue, status) → rows of soniq_jobs."""
    due: dict[str, int] = field(default_factory=dict)
    """queue → queued jobs that are due now."""
    oldest_due: dict[str, dt.datetime] = field(default_factory=dict)
    """queue → since when its longest-waiting due job has been runnable."""
    lapsed_leases: dict[str, int] = field(default_factory=dict)
    """queue → processing jobs whose lease has lapsed (the next claim's reaper settles them)."""
    dead_letters: dict[tuple[str, str], int] = field(default_factory=dict)
    """(queue, reason) → rows of soniq_dead_letter_jobs."""

    @property
    def queues(self) -> list[str]:
        return sorted({q for q, _ in self.jobs} | {q for q, _ in self.dead_letters})

    def oldest_due_age(self, queue: str) -> float:
        """Seconds the queue's longest-waiting due job has waited (0 when none is due)."""
        since = self.oldest_due.get(queue)
        return 0.0 if since is None else max(0.0, (self.now - since).total_seconds())


def _aware(value: object) -> dt.datetime | None:
    """A MIN() of timestamps: a datetime on PostgreSQL, text on SQLite (its type is lost)."""
    if value is None:
        return None
    moment = value if isinstance(value, dt.datetime) else parse_datetime(str(value))
    if moment is None:
        return None
    return moment if timezone.is_aware(moment) else moment.replace(tzinfo=dt.timezone.utc)


def read_queues(using: str) -> QueueFigures:
    """Run the one query on database ``using``; raises what the database raises."""
    connection = connections[using]
    now = timezone.now()
    sql = QUERY.format(jobs=connection.ops.quote_name(Job._meta.db_table),
                       dead=connection.ops.quote_name(DeadLetterJob._meta.db_table))
    figures = QueueFigures(now=now)
    with connection.cursor() as cursor:
        cursor.execute(sql, {"now": connection.ops.adapt_datetimefield_value(now)})
        rows = cursor.fetchall()
    for table, queue, key, count, due, oldest, lapsed in rows:
        if table == 1:
            figures.dead_letters[(queue, key)] = int(count)
            continue
        figures.jobs[(queue, key)] = int(count)
        figures.due[queue] = figures.due.get(queue, 0) + int(due or 0)
        figures.lapsed_leases[queue] = figures.lapsed_leases.get(queue, 0) + int(lapsed or 0)
        since = _aware(oldest)
        if since is not None:
            earlier = figures.oldest_due.get(queue)
            figures.oldest_due[queue] = since if earlier is None else min(earlier, since)
    return figures


def bounded(figures: QueueFigures, limit: int) -> QueueFigures:
    """``figures`` with the queues past the first ``limit`` by name summed as ``__other__``.

    Counts add up, the oldest due job is the oldest of them all, and a
    dead-letter reason soniq does not know is ``other``.
    """
    kept = set(figures.queues[:limit])

    def label(queue: str) -> str:
        return queue if queue in kept else OTHER

    jobs: Counter[tuple[str, str]] = Counter()
    dead: Counter[tuple[str, str]] = Counter()
    due: Counter[str] = Counter()
    lapsed: Counter[str] = Counter()
    oldest: dict[str, dt.datetime] = {}
    for (queue, status), count in figures.jobs.items():
        jobs[(label(queue), status)] += count
    for (queue, why), count in figures.dead_letters.items():
        dead[(label(queue), reason(why))] += count
    for queue, count in figures.due.items():
        due[label(queue)] += count
    for queue, count in figures.lapsed_leases.items():
        lapsed[label(queue)] += count
    for queue, since in figures.oldest_due.items():
        name = label(queue)
        oldest[name] = min(since, oldest.get(name, since))
    return QueueFigures(now=figures.now, jobs=dict(jobs), due=dict(due), oldest_due=oldest,
                        lapsed_leases=dict(lapsed), dead_letters=dict(dead))


class QueueCollector(Collector):
    """The queue-level series of database ``using``, read at most once per ``cache_seconds``.

    ``cache_seconds`` (default: ``SONIQ["METRICS_CACHE_SECONDS"]``, read at
    each scrape) is how long one read's figures are served again; 0 reads
    at every scrape. A failed query is logged (without the driver's text),
    reported as ``soniq_queue_metrics_up 0`` rather than failing the
    scrape, and never served again. ``close_connection``: close this
    thread's connection after the query (a worker's metrics thread; a view
    leaves that to Django).
    """

    def __init__(self, using: str = "default", *, close_connection: bool = False,
                 cache_seconds: float | None = None):
        self.using = using
        self.close_connection = close_connection
        self.cache_seconds = cache_seconds
        self._lock = threading.Lock()
        self._read: tuple[float, float, QueueFigures] | None = None  # (at, took, figures)

    def _seconds(self) -> float:
        if self.cache_seconds is not None:
            return self.cache_seconds
        value = get_settings().METRICS_CACHE_SECONDS
        return float(value) if isinstance(value, (int, float)) and value >= 0 else 10.0

    def _figures(self) -> tuple[float, float, QueueFigures] | None:
        """(when read, seconds it took, figures): one read shared by the scrapes of its time."""
        with self._lock:  # a scrape that comes while a read runs waits for it
            read = self._read
            if read is not None and time.monotonic() - read[0] < self._seconds():
                return read
            started = time.monotonic()
            try:
                figures = read_queues(self.using)
            except (DatabaseError, SoniqError) as error:
                logger.warning("queue metrics: the query on database %r failed (%s)", self.using,
                               type(error).__name__)
                self._read = None
                return None
            finally:
                if self.close_connection:
                    connections[self.using].close()
            self._read = (started, time.monotonic() - started, figures)
            return self._read

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("soniq_queue_metrics_up",
                               "1 if the queue-level query succeeded at this scrape, else 0")
        read = self._figures()
        if read is None:
            up.add_metric([], 0)
            yield up
            return
        at, took_seconds, figures = read
        up.add_metric([], 1)
        yield up
        took = GaugeMetricFamily("soniq_queue_metrics_query_seconds",
                                 "Seconds the queue-level query took (the read served)")
        took.add_metric([], took_seconds)
        yield took
        age = GaugeMetricFamily("soniq_queue_metrics_age_seconds",
                                "Seconds since the queue-level figures served were read")
        age.add_metric([], max(time.monotonic() - at, 0.0))
        yield age
        yield from _families(bounded(figures, max_queues()))


def _families(figures: QueueFigures) -> Iterator[Metric]:
    jobs = GaugeMetricFamily("soniq_queue_jobs", "Jobs in soniq_jobs by queue and status",
                             labels=["queue", "status"])
    due = GaugeMetricFamily("soniq_queue_due_jobs",
                            "Queued jobs that are due now (not waiting for a later time)",
                            labels=["queue"])
    age = GaugeMetricFamily("soniq_queue_oldest_due_job_age_seconds",
                            "Seconds the longest-waiting due job has waited (0: none due)",
                            labels=["queue"])
    lapsed = GaugeMetricFamily("soniq_queue_lapsed_leases",
                               "Processing jobs whose lease has lapsed, not yet settled",
                               labels=["queue"])
    for queue in figures.queues:
        for status in JobStatus.values:
            jobs.add_metric([queue, status], figures.jobs.get((queue, status), 0))
        due.add_metric([queue], figures.due.get(queue, 0))
        age.add_metric([queue], figures.oldest_due_age(queue))
        lapsed.add_metric([queue], figures.lapsed_leases.get(queue, 0))
    for (queue, status), count in sorted(figures.jobs.items()):
        if status not in JobStatus.values:  # a status another Soniq version wrote
            jobs.add_metric([queue, status], count)
    dead = GaugeMetricFamily("soniq_queue_dead_letters",
                             "Jobs in soniq_dead_letter_jobs by queue and reason",
                             labels=["queue", "reason"])
    for (queue, reason), count in sorted(figures.dead_letters.items()):
        dead.add_metric([queue, reason], count)
    yield from (jobs, due, age, lapsed, dead)
