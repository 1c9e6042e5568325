"""What the queues look like now, as plain data: for the admin dashboard and ``soniq_status``.

``snapshot()`` reads the queues in a fixed number of queries (nine, however
many jobs there are, and one for the database's clock on PostgreSQL; with
``estimate``, one more for the plan, and five more on a big table: the
statistics and the live counts) and returns frozen values; ``chart()`` turns the last
hour's throughput into the geometry of an SVG bar chart, so the template
only draws. Nothing here writes.

With ``estimate=True`` (the dashboard) on a table too big to count cheaply
(``estimates.cheap``), the finished jobs (``done``, ``cancelled``) are not
counted: their numbers per queue are estimates from the table's statistics
(``Snapshot.estimated`` names them), and only the queued and running jobs
are counted, through their partial indexes. The oldest due job's wait reads
the queued jobs' index and the first ``DUE_SCHEDULED_READ`` scheduled jobs
to fall due, never the finished rows.
"""

import datetime as dt
from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Count, Max, Min, Q
from django.db.models.functions import Now
from django.utils import timezone

from . import estimates
from .conf import get_settings
from .models import DeadLetterJob, Job, JobStatus, TaskRegistration, Worker, WorkerState
from .replay import still_dead
from .throughput import minute_of, per_minute

DEAD_LETTER = "dead_letter"
STATUS_COLUMNS = (*JobStatus.values, DEAD_LETTER)
"""The table's columns: the four job states, then the dead letters."""
CHART_KINDS = ("done", "failed", "dead_lettered", "cancelled")
"""Outcomes stacked in each bar, bottom first (``failed`` = an attempt that will be retried)."""
LABELS = {
    "queued": "Queued", "processing": "Processing", "done": "Done", "cancelled": "Cancelled",
    DEAD_LETTER: "Dead letter", "failed": "Failed", "dead_lettered": "Dead-lettered",
}
WINDOW_MINUTES = 60
FINISHED = (JobStatus.DONE, JobStatus.CANCELLED)
DUE_SCHEDULED_READ = 1_000
"""Scheduled jobs that fell due read for the oldest wait (the first ones to fall due)."""


@dataclass(frozen=True)
class QueueRow:
    """One queue: how many jobs in each column, and how long its oldest due job has waited."""

    queue: str
    cells: tuple[tuple[str, int], ...]  # (status, count) in STATUS_COLUMNS order
    waiting_since: dt.datetime | None
    oldest_wait: dt.timedelta | None

    @property
    def oldest_wait_text(self) -> str:
        return "-" if self.oldest_wait is None else duration_text(self.oldest_wait)


@dataclass(frozen=True)
class LiveWorker:
    """A worker whose heartbeat is recent: a soniq_django worker or one of Soniq's own."""

    id: str
    hostname: str
    pid: int
    queues: tuple[str, ...] | None  # None: every queue (Soniq writes an empty list for that)
    concurrency: int
    status: str
    started_at: dt.datetime
    last_heartbeat: dt.datetime
    heard_ago: dt.timedelta
    version: str | None  # "soniq_django <version>"; Soniq 0.1.0 leaves it empty

    @property
    def heard_ago_text(self) -> str:
        return duration_text(self.heard_ago)


@dataclass(frozen=True)
class RegisteredTask:
    """One job name of soniq_task_registry, over every worker that registered it."""

    task_name: str
    live_workers: int  # live workers that registered it
    workers: int  # rows: every worker, live or gone, that ever registered it
    last_seen: dt.datetime
    queue: str | None  # the handler's queue; None when only Soniq's workers registered it
    max_attempts: int | None


@dataclass(frozen=True)
class MinuteCount:
    """Jobs finished in one minute, by outcome (KINDS of soniq_django.throughput)."""

    minute: dt.datetime
    counts: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.counts.get(kind, 0) for kind in CHART_KINDS)


@dataclass(frozen=True)
class Snapshot:
    now: dt.datetime
    queues: tuple[QueueRow, ...]
    totals: tuple[tuple[str, int], ...]  # (status, count) over all queues
    dead_letters_by_reason: tuple[tuple[str, int], ...]
    live_workers: tuple[LiveWorker, ...]
    silent_workers: int  # not stopped, but no heartbeat within the live window
    live_window: dt.timedelta
    throughput: tuple[MinuteCount, ...]  # WINDOW_MINUTES minutes, oldest first
    tasks: tuple[RegisteredTask, ...]  # by job name
    estimated: frozenset[str] = frozenset()  # statuses whose counts are estimates


def duration_text(span: dt.timedelta) -> str:
    """``span`` the way people say it: "45 s", "3 min 12 s", "2 h 5 min", "3 d 4 h"."""
    seconds = max(int(span.total_seconds()), 0)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {seconds} s"
    return f"{seconds} s"


def live_window() -> dt.timedelta:
    """How recent a heartbeat must be for a worker to count as live.

    Three heartbeats, but never less than a minute: a worker busy with a
    slow database must not flicker in and out.
    """
    return dt.timedelta(seconds=max(3 * float(get_settings().HEARTBEAT_SECONDS), 60.0))


def database_time(using: str) -> Any:
    """"Now" for a time written to or compared with a row of ``using``, by the database's clock.

    On PostgreSQL an expression the server evaluates (``Now()``, its
    ``statement_timestamp()``), so that no host's clock is compared with
    the times the database wrote; on SQLite, whose clock is this host's (a
    file on this machine), ``timezone.now()``. Usable in ``filter()``,
    ``update()`` and arithmetic with a ``timedelta``.
    """
    if connections[using].vendor == "postgresql":
        return Now()
    return timezone.now()


def live_since(using: str) -> Any:
    """The earliest heartbeat that makes a worker live now, by the database's clock.

    ``database_time(using) - live_window()``: compare ``last_heartbeat``
    with it (``last_heartbeat__gte=live_since(using)``). Workers write their
    heartbeat by the same clock (worker/registration.py), so a host whose
    clock is off neither loses its live workers nor keeps dead ones.
    """
    return database_time(using) - live_window()


def database_now(using: str) -> dt.datetime:
    """The database's clock read now (PostgreSQL: one query); SQLite: ``timezone.now()``."""
    now: dt.datetime
    if connections[using].vendor != "postgresql":
        now = timezone.now()
        return now
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_catalog.statement_timestamp()")
        now = cursor.fetchone()[0]
    return now


def snapshot(using: str = DEFAULT_DB_ALIAS, now: dt.datetime | None = None, *,
             estimate: bool = False) -> Snapshot:
    """Read the dashboard's numbers from database ``using``; returns a Snapshot.

    ``now`` (default: the database's clock, one query more on PostgreSQL)
    is when ages and the live window are counted from. ``estimate``: the
    finished jobs' counts may be estimates (see the module's docstring).
    """
    now = now or database_now(using)
    counts, estimated = _counts(using, estimate)
    waiting = _oldest_due(using, now)
    queues = tuple(
        QueueRow(
            queue=name,
            cells=tuple((status, counts[name].get(status, 0)) for status in STATUS_COLUMNS),
            waiting_since=waiting.get(name),
            oldest_wait=(now - waiting[name]) if name in waiting else None,
        )
        for name in sorted(counts)
    )
    totals = tuple(
        (status, sum(per_queue.get(status, 0) for per_queue in counts.values()))
        for status in STATUS_COLUMNS
    )
    by_reason: Counter[str] = Counter()
    for (_, reason), n in _dead_letters(using).items():
        by_reason[reason] += n
    reasons = sorted(by_reason.items(), key=lambda item: (-item[1], item[0]))
    window = live_window()
    live, silent = _workers(using, now, window)
    return Snapshot(
        now=now, queues=queues, totals=totals, dead_letters_by_reason=tuple(reasons),
        live_workers=live, silent_workers=silent, live_window=window,
        throughput=_throughput(using, now), tasks=_tasks(using, live), estimated=estimated,
    )


def _counts(using: str, estimate: bool = False
            ) -> tuple[dict[str, dict[str, int]], frozenset[str]]:
    """({queue: {status: count}}, the statuses estimated), dead letters included.

    Exact: two GROUP BY queries. Estimated (``estimate``, and the exact
    count would cost more than ``estimates.COST_LIMIT``): the queued and the
    running jobs counted through their partial indexes, the finished ones
    from the statistics (``_finished_estimates``).
    A replayed job counts once, in its status in ``soniq_jobs``: its dead-letter
    row counts again only when it fails again (``replay.still_dead``).
    """
    counts: dict[str, dict[str, int]] = {}
    jobs = Job.objects.using(using)
    rows = jobs.values_list("queue", "status").annotate(n=Count("id")).order_by()
    estimated: frozenset[str] = frozenset()
    finished = _finished_estimates(using) if estimate and not estimates.cheap(rows) else None
    if finished is None:
        for queue, status, n in rows:
            counts.setdefault(queue, {})[status] = n
    else:
        for status in (JobStatus.QUEUED, JobStatus.PROCESSING):
            # COUNT(*): the queued jobs' claim index alone answers (index-only).
            live = jobs.filter(status=status).values_list("queue").annotate(n=Count("*"))
            for queue, n in live.order_by():
                counts.setdefault(queue, {})[status] = n
        for queue, (rows_of_queue, shares) in finished.items():
            left = rows_of_queue - sum(counts.get(queue, {}).values())
            for status, share in shares.items():
                if round(left * share) > 0:
                    counts.setdefault(queue, {})[status] = round(left * share)
        estimated = frozenset(FINISHED)
    for (queue, _), n in _dead_letters(using).items():
        cells = counts.setdefault(queue, {})
        cells[DEAD_LETTER] = cells.get(DEAD_LETTER, 0) + n
    return counts, estimated


def _finished_estimates(using: str) -> dict[str, tuple[float, dict[str, float]]] | None:
    """{queue: (its estimated rows, {finished status: its share of the finished rows})}.

    From the statistics: the table's rows times each queue's share (ANALYZE's
    most common values), and the finished statuses in their overall ratio.
    None without statistics (never analyzed, or not PostgreSQL).
    """
    rows = estimates.table_rows(using, Job)
    queues = estimates.frequencies(using, Job, "queue")
    statuses = estimates.frequencies(using, Job, "status")
    if rows is None or queues is None or statuses is None:
        return None
    finished = sum(statuses.get(status, 0.0) for status in FINISHED)
    shares = {status: statuses.get(status, 0.0) / finished if finished else 0.0
              for status in FINISHED}
    return {queue: (rows * share, shares) for queue, share in queues.items()}


def _dead_letters(using: str) -> dict[tuple[str, str], int]:
    """{(queue, reason): dead letters} of those dead now (one GROUP BY query)."""
    rows = DeadLetterJob.objects.using(using).filter(still_dead()).values_list(
        "queue", "dead_letter_reason").annotate(n=Count("id")).order_by()
    return {(queue, reason): n for queue, reason, n in rows}


def _oldest_due(using: str, now: dt.datetime) -> dict[str, dt.datetime]:
    """{queue: since when its longest-waiting due job has been runnable}.

    A job queued for later (``run_at``, a retry's backoff) is not waiting
    yet, so it is left out; a due job has waited since it became due
    (``scheduled_at``) or was enqueued, whichever is later.
    """
    queued = Job.objects.using(using).filter(status=JobStatus.QUEUED)
    # The jobs never scheduled: the oldest per queue from the index of their
    # claim order (soniq_jobs_claim_queue_now_idx, index-only).
    found: dict[str, dt.datetime] = dict(
        queued.filter(scheduled_at__isnull=True).values_list("queue")
        .annotate(since=Min("created_at")).order_by())
    # The scheduled ones that fell due, in the order they fell due
    # (soniq_jobs_claim_due_idx), the first DUE_SCHEDULED_READ of them: a
    # backlog of them is never read whole. Each became due at its run_at, or
    # when it was enqueued if that was later.
    due = queued.filter(scheduled_at__isnull=False, scheduled_at__lte=now).order_by(
        "scheduled_at").values_list("queue", "scheduled_at", "created_at")
    for queue, scheduled_at, created_at in due[:DUE_SCHEDULED_READ]:
        became_due = max(scheduled_at, created_at)
        if queue not in found or became_due < found[queue]:
            found[queue] = became_due
    return found


def _workers(using: str, now: dt.datetime, window: dt.timedelta
             ) -> tuple[tuple[LiveWorker, ...], int]:
    """Live workers (by host and pid) and how many others are not stopped yet silent."""
    heard_after = now - window
    running = Worker.objects.using(using).exclude(status=WorkerState.STOPPED)
    live = tuple(
        LiveWorker(
            id=str(worker.id), hostname=worker.hostname, pid=worker.pid,
            queues=tuple(worker.queues) if worker.queues else None,
            concurrency=worker.concurrency, status=worker.status,
            started_at=worker.started_at, last_heartbeat=worker.last_heartbeat,
            heard_ago=max(now - worker.last_heartbeat, dt.timedelta(0)),
            version=worker.version,
        )
        for worker in running.filter(last_heartbeat__gte=heard_after)
        .order_by("hostname", "pid")
    )
    silent = running.filter(last_heartbeat__lt=heard_after).count()
    return live, silent


def _tasks(using: str, live: tuple[LiveWorker, ...]) -> tuple[RegisteredTask, ...]:
    """soniq_task_registry summed per job name (one GROUP BY query).

    Soniq's composite key gives one row per job name and worker, so a name
    counts its live workers among the workers that ever registered it.
    """
    live_ids = [worker.id for worker in live]
    rows = (
        TaskRegistration.objects.using(using).values("task_name")
        .annotate(workers=Count("worker_id"),
                  live=Count("worker_id", filter=Q(worker_id__in=live_ids)),
                  last_seen=Max("last_seen_at"), queue=Max("queue"),
                  max_attempts=Max("max_attempts"))
        .order_by("task_name")
    )
    return tuple(
        RegisteredTask(task_name=row["task_name"], live_workers=row["live"],
                       workers=row["workers"], last_seen=row["last_seen"], queue=row["queue"],
                       max_attempts=row["max_attempts"])
        for row in rows
    )


def _throughput(using: str, now: dt.datetime) -> tuple[MinuteCount, ...]:
    """The last WINDOW_MINUTES minutes (this one included), zeros where nothing finished."""
    last = minute_of(now)
    first = last - dt.timedelta(minutes=WINDOW_MINUTES - 1)
    totals = per_minute(using, first)
    return tuple(
        MinuteCount(minute, dict(totals.get(minute, {})))
        for minute in (first + dt.timedelta(minutes=i) for i in range(WINDOW_MINUTES))
    )


# -- the chart -----------------------------------------------------------------

@dataclass(frozen=True)
class Segment:
    kind: str
    count: int
    y: float
    height: float


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    title: str  # shown by the browser on hover, no script needed
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class Tick:
    label: str
    x: float
    y: float


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    left: int
    top: int
    middle: float  # y of the plot's middle, where the y axis is titled
    bottom: float  # y of the x axis
    right: float  # x where the plot ends
    plot_height: float
    bars: tuple[Bar, ...]
    y_ticks: tuple[Tick, ...]
    x_ticks: tuple[Tick, ...]
    peak: int  # the value the top of the y axis stands for
    empty: bool


def chart(minutes: tuple[MinuteCount, ...], *, width: int = 720, height: int = 220) -> Chart:
    """Lay out stacked bars, one per minute, with labelled axes (SVG user units)."""
    left, top, right_margin, bottom_margin = 52, 10, 10, 28
    plot_w, plot_h = width - left - right_margin, height - top - bottom_margin
    base = top + plot_h
    peak = _nice_ceiling(max((m.total for m in minutes), default=0))
    slot = plot_w / max(len(minutes), 1)
    bars = []
    for i, minute in enumerate(minutes):
        y, segments = float(base), []
        for kind in CHART_KINDS:
            count = minute.counts.get(kind, 0)
            if count:
                h = plot_h * count / peak
                y -= h
                segments.append(Segment(kind, count, round(y, 2), round(h, 2)))
        label = timezone.localtime(minute.minute).strftime("%H:%M")
        detail = ", ".join(f"{kind.replace('_', ' ')} {minute.counts.get(kind, 0)}"
                           for kind in CHART_KINDS)
        bars.append(Bar(round(left + i * slot + slot * 0.1, 2), round(slot * 0.8, 2),
                        f"{label}: {detail}", tuple(segments)))
    y_ticks = tuple(
        Tick(str(peak * step // 4), left - 6, round(base - plot_h * step / 4, 2))
        for step in range(5)
    )
    x_ticks = tuple(
        Tick(timezone.localtime(m.minute).strftime("%H:%M"), round(left + (i + 0.5) * slot, 2),
             height - 8)
        for i, m in enumerate(minutes) if i % 10 == 0 or i == len(minutes) - 1
    )
    return Chart(width, height, left, top, top + plot_h / 2, base, left + plot_w, plot_h,
                 tuple(bars), y_ticks, x_ticks, peak, empty=not any(m.total for m in minutes))


def _nice_ceiling(value: int) -> int:
    """The smallest of 4, 8, 20, 40, 80, 200, … at least ``value``: quarters stay whole."""
    ceiling = 4
    while ceiling < value:
        ceiling = ceiling * 2 if str(ceiling)[0] in "24" else ceiling * 5 // 2
    return ceiling


# -- manage.py soniq_status ---------------------------------------------------

STATUSES = list(STATUS_COLUMNS)
UNKNOWN_VERSION = "unknown"
"""How a live worker that wrote no ``version`` is counted (Soniq 0.1.0's workers write none)."""


def queue_summary(using: str = "default") -> dict[str, Any]:
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
