"""Why due jobs wait: the queued jobs split by when they may run, the limits, the workers' slots.

The dashboard's counts per state say how many jobs are queued; this module
says which of them could run now and what holds those back, as plain,
frozen data (``read``):

- each queue's queued jobs split in four: **due** now, **scheduled** for a
  later ``run_at`` and never tried, **retrying**: tried before, waiting
  for their backoff's ``run_at``, and **waiting** for the jobs they depend
  on (``depends_on``, a batch's callback: held at ``WAITING_SCHEDULED_AT``
  until released, producer/dependencies.py). "Later" is by the database's
  clock (the overview's ``now``), never this host's;
- each queue's flow control (``soniq_queue_settings``, flow.py): paused or
  not, its concurrency limit with how many of its jobs run now (its
  ``processing`` rows plus its live holds, as a claim counts them), and its
  rate limit with how many starts are in the window now (``soniq_queue_starts``);
- the live workers' slots: each one's concurrency, and how many jobs it
  runs now (its ``processing`` rows);
- for a queue with due jobs, what holds them back (``HELD_BACK``): paused,
  at its concurrency limit, at its rate limit, no live worker serves it, or
  every slot of the workers that serve it is in use.

Five small queries, each on an index or a small table: the queued jobs with
a later ``run_at`` (soniq_jobs_claim_due_idx; the waiting ones are among
them, told apart by their ``scheduled_at``, at no extra read), the settings rows, the live
holds and the rate window's starts of the limited queues, and the running
jobs of the live workers (soniq_jobs_lease_idx). The due count is the
queue's queued count, from the overview, less the later ones: no query
reads the due backlog itself.
"""

import datetime as dt
import functools
import operator
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from django.db.models import Count, Q

from .models import WAITING_SCHEDULED_AT, Job, JobStatus, QueueHold, QueueSetting, QueueStart

HELD_BACK = {
    "paused": "paused",
    "concurrency": "at its concurrency limit",
    "rate": "at its rate limit",
    "no_worker": "no live worker serves it",
    "slots": "every slot of its workers is in use",
}
"""What may hold a queue's due jobs back, and how the dashboard says it."""

QUEUED_PARTS = ("due", "scheduled", "retrying", "waiting")
"""The parts the queued jobs are split into (``QueueWaits``' fields of those names)."""


@dataclass(frozen=True)
class Limits:
    """A queue's flow control as claims apply it now, with what counts against it."""

    paused: bool = False
    paused_by: str | None = None
    paused_at: dt.datetime | None = None
    concurrency: int | None = None
    """At most this many of its jobs run at once (None: no limit)."""
    running: int = 0
    """Its jobs running now, as a claim counts them: processing rows and live holds."""
    rate: tuple[int, int] | None = None
    """At most ``rate[0]`` starts in any ``rate[1]`` seconds (None: no limit)."""
    started: int = 0
    """Starts within the rate's window now (0 without a rate limit)."""
    has_row: bool = False
    """Whether the queue has a row in soniq_queue_settings."""

    @property
    def at_concurrency(self) -> bool:
        return self.concurrency is not None and self.running >= self.concurrency

    @property
    def at_rate(self) -> bool:
        return self.rate is not None and self.started >= self.rate[0]

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate is not None


@dataclass(frozen=True)
class QueueWaits:
    """One queue's queued jobs by when they may run, its limits, what holds its due jobs back."""

    queue: str
    due: int
    scheduled: int
    retrying: int
    limits: Limits
    held_back_by: tuple[str, ...]  # keys of HELD_BACK; empty when nothing is due
    waiting: int = 0
    """Queued jobs waiting for the jobs they depend on (not counted in ``scheduled``)."""

    @property
    def held_back_text(self) -> str:
        return "; ".join(HELD_BACK[key] for key in self.held_back_by)


@dataclass(frozen=True)
class WorkerSlots:
    """A live worker's slots: its concurrency, and the jobs it runs now."""

    worker_id: str
    queues: tuple[str, ...] | None  # None: every queue
    concurrency: int
    in_use: int

    def serves(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues


@dataclass(frozen=True)
class Waits:
    queues: dict[str, QueueWaits]
    workers: dict[str, WorkerSlots]  # live worker id -> its slots

    @property
    def slots(self) -> int:
        return sum(worker.concurrency for worker in self.workers.values())

    @property
    def slots_in_use(self) -> int:
        return sum(min(worker.in_use, worker.concurrency) for worker in self.workers.values())

    @property
    def totals(self) -> dict[str, int]:
        return {part: sum(getattr(row, part) for row in self.queues.values())
                for part in QUEUED_PARTS}


class LiveWorker(Protocol):
    """What ``read`` needs of a live worker (``overview.LiveWorker`` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def queues(self) -> tuple[str, ...] | None: ...

    @property
    def concurrency(self) -> int: ...


def read(using: str, now: dt.datetime, queued: Mapping[str, int], processing: Mapping[str, int],
         live_workers: Iterable[LiveWorker]) -> Waits:
    """The waits of every queue in ``queued`` (its queued jobs) or with a settings row.

    ``now`` is the database's clock (``overview.database_now``), ``queued``
    and ``processing`` the queued and running jobs per queue, and
    ``live_workers`` the live workers, all as the overview read them.
    """
    later = _later(using, now)
    settings = {row.queue: row for row in QueueSetting.objects.using(using).only(
        "queue", "paused", "paused_by", "paused_at", "concurrency", "configured_concurrency",
        "rate_limit", "rate_period", "configured_rate_limit", "configured_rate_period")}
    holds = _holds(using, now, [name for name, row in settings.items()
                                if row.effective_concurrency is not None])
    starts = _starts(using, now, {name: row.effective_rate for name, row in settings.items()
                                  if row.effective_rate is not None})
    workers = _slots(using, live_workers)
    queues = {}
    for name in sorted(set(queued) | set(settings)):
        scheduled, retrying, waiting = later.get(name, (0, 0, 0))
        due = max(queued.get(name, 0) - scheduled - retrying - waiting, 0)
        row = settings.get(name)
        limits = Limits() if row is None else Limits(
            paused=row.paused, paused_by=row.paused_by, paused_at=row.paused_at,
            concurrency=row.effective_concurrency,
            running=processing.get(name, 0) + holds.get(name, 0),
            rate=row.effective_rate, started=starts.get(name, 0), has_row=True)
        queues[name] = QueueWaits(name, due, scheduled, retrying, limits,
                                  _held_back(name, due, limits, workers.values()), waiting)
    return Waits(queues=queues, workers=workers)


def _held_back(queue: str, due: int, limits: Limits, workers: Iterable[WorkerSlots]
               ) -> tuple[str, ...]:
    if not due:
        return ()
    found = []
    if limits.paused:
        found.append("paused")
    if limits.at_concurrency:
        found.append("concurrency")
    if limits.at_rate:
        found.append("rate")
    serving = [worker for worker in workers if worker.serves(queue)]
    if not serving:
        found.append("no_worker")
    elif all(worker.in_use >= worker.concurrency for worker in serving):
        found.append("slots")
    return tuple(found)


def _later(using: str, now: dt.datetime) -> dict[str, tuple[int, int, int]]:
    """{queue: (scheduled, retrying, waiting)}: queued jobs whose run_at is after ``now``.

    Reads only those rows (soniq_jobs_claim_due_idx: queued, scheduled_at
    set, in scheduled_at order), never the due backlog. A job waiting for
    its dependencies is held at WAITING_SCHEDULED_AT (9999-01-01, the mark
    operations.py's retry-now honours too), whatever its attempts.
    """
    held = Q(scheduled_at=WAITING_SCHEDULED_AT)
    rows = (Job.objects.using(using).filter(status=JobStatus.QUEUED, scheduled_at__gt=now)
            .values_list("queue")
            .annotate(scheduled=Count("id", filter=Q(attempts=0) & ~held),
                      retrying=Count("id", filter=Q(attempts__gt=0) & ~held),
                      waiting=Count("id", filter=held))
            .order_by())
    return {queue: (scheduled, retrying, waiting) for queue, scheduled, retrying, waiting in rows}


def _holds(using: str, now: dt.datetime, queues: list[str]) -> dict[str, int]:
    """{queue: live holds}: slots kept by handlers that outlived their claims (QueueHold)."""
    if not queues:
        return {}
    rows = (QueueHold.objects.using(using).filter(queue__in=queues, lease_expires_at__gt=now)
            .values_list("queue").annotate(n=Count("id")).order_by())
    return dict(rows)


def _starts(using: str, now: dt.datetime, rates: dict[str, tuple[int, int]]) -> dict[str, int]:
    """{queue: starts in its rate window}, as the next claim would count them."""
    if not rates:
        return {}
    window = functools.reduce(operator.or_, (
        Q(queue=queue, started_at__gt=now - dt.timedelta(seconds=period))
        for queue, (_, period) in rates.items()))
    rows = (QueueStart.objects.using(using).filter(window).values_list("queue")
            .annotate(n=Count("id")).order_by())
    return dict(rows)


def _slots(using: str, live_workers: Iterable[LiveWorker]) -> dict[str, WorkerSlots]:
    """Each live worker's slots and the jobs it runs now (its processing rows)."""
    live = list(live_workers)
    if not live:
        return {}
    running = dict(Job.objects.using(using).filter(
        status=JobStatus.PROCESSING, claim_owner__in=[worker.id for worker in live])
        .values_list("claim_owner").annotate(n=Count("id")).order_by())
    return {worker.id: WorkerSlots(worker.id, worker.queues, worker.concurrency,
                                   running.get(worker.id, 0)) for worker in live}
