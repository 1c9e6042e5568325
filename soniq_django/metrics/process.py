"""This process's counters and run-time histogram, fed by the signals of soniq_django.signals.

They count what this process saw: a worker process its jobs, a web process
the jobs it enqueued. The receivers are connected when this module is
imported (importing ``soniq_django.metrics`` does it), once per process
(``dispatch_uid``); before that the signals have no receiver and cost
nothing. Each receiver only increments a counter: no database, no I/O.
Their label values are bounded (labels.py): a process labels at most
``SONIQ["METRICS_MAX_QUEUES"]`` queues and sums the rest as ``__other__``.
"""

from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.registry import Collector

from .. import signals
from .labels import MAX_WORKER_IDS, FirstSeen, max_queues, reason

#: This process's queue labels: the first METRICS_MAX_QUEUES queues it counts; later ones are
#: counted as "__other__" (labels.py).
queue_label = FirstSeen(max_queues)
worker_label = FirstSeen(lambda: MAX_WORKER_IDS)

#: The run-time histogram's buckets, in seconds: jobs last from milliseconds to an hour.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 900.0, 1800.0, 3600.0)

ENQUEUED = Counter("soniq_jobs_enqueued", "Jobs this process enqueued", ["queue"], registry=None)
STARTED = Counter("soniq_jobs_started", "Runs this process's workers started", ["queue"],
                  registry=None)
FINISHED = Counter("soniq_jobs_finished",
                   "Runs whose final write applied, by outcome (done, retry, dead, cancelled, "
                   "deferred)", ["queue", "outcome"], registry=None)
DURATION = Histogram("soniq_job_duration_seconds",
                     "Seconds from a run's start to its applied final write", ["queue"],
                     buckets=DURATION_BUCKETS, registry=None)
RETRIES = Counter("soniq_job_retries", "Failed runs queued again for a later attempt",
                  ["queue"], registry=None)
DEAD_LETTERED = Counter("soniq_jobs_dead_lettered", "Jobs this process dead-lettered, by reason",
                        ["queue", "reason"], registry=None)
REFUSED = Counter("soniq_completions_refused",
                  "Final writes the fence refused: stale writes stopped (the claim was no "
                  "longer this worker's)", ["queue"], registry=None)
LEASE_LAPSES = Counter("soniq_lease_lapses",
                       "Running jobs whose lease a heartbeat found gone", ["queue"],
                       registry=None)
HEARTBEATS = Counter("soniq_worker_heartbeats", "Heartbeats that renewed a worker's row",
                     ["worker_id"], registry=None)


def process_collectors() -> tuple[Collector, ...]:
    """Every series of this module, to register in a ``CollectorRegistry``."""
    return (ENQUEUED, STARTED, FINISHED, DURATION, RETRIES, DEAD_LETTERED, REFUSED,
            LEASE_LAPSES, HEARTBEATS)


OUTCOMES = frozenset({"done", "retry", "dead", "cancelled", "deferred"})


def _enqueued(queue: str, **_: Any) -> None:
    ENQUEUED.labels(queue_label(queue)).inc()


def _started(queue: str, **_: Any) -> None:
    STARTED.labels(queue_label(queue)).inc()


def _finished(queue: str, outcome: str, duration: float, dead_letter_reason: str | None,
              **_: Any) -> None:
    label = queue_label(queue)
    FINISHED.labels(label, outcome if outcome in OUTCOMES else "other").inc()
    DURATION.labels(label).observe(duration)
    if outcome == "retry":
        RETRIES.labels(label).inc()
    elif outcome == "dead":
        DEAD_LETTERED.labels(label, reason(dead_letter_reason)).inc()


def _refused(queue: str, **_: Any) -> None:
    REFUSED.labels(queue_label(queue)).inc()


def _lost(queue: str, **_: Any) -> None:
    LEASE_LAPSES.labels(queue_label(queue)).inc()


def _heartbeat(worker_id: str, **_: Any) -> None:
    HEARTBEATS.labels(worker_label(worker_id)).inc()


for _signal, _receiver in ((signals.job_enqueued, _enqueued), (signals.job_started, _started),
                           (signals.job_finished, _finished), (signals.job_refused, _refused),
                           (signals.lease_lost, _lost), (signals.worker_heartbeat, _heartbeat)):
    _signal.connect(_receiver, dispatch_uid=f"soniq_django.metrics.{_receiver.__name__}")
