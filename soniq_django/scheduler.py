"""The scheduler: turns ``soniq_recurring_jobs`` rows into jobs, each tick exactly once.

Several schedulers may run at once (processes, hosts, worker threads). Each
tick of a row is claimed in the database: one transaction locks the due rows
(PostgreSQL ``FOR UPDATE SKIP LOCKED``; SQLite by taking the write lock first),
reads ``next_run`` under that lock, enqueues the job, moves ``next_run`` on and
commits. A scheduler that comes second sees the moved ``next_run`` and does
nothing. See docs/scheduling.md.
"""

import datetime as dt
import hashlib
import logging
import threading
import uuid
from typing import Any

from django.db import Error as DatabaseError
from django.db import IntegrityError, connections, router, transaction
from django.db.models import F, Q
from django.utils import timezone

from .errors import ErrorCode, SoniqError
from .producer.request import MAX_LABEL_LENGTH
from .models import RecurringJob, ScheduleStatus
from .periodic_jobs import PeriodicSchedule, Timing, code_schedules
from .producer import enqueue

logger = logging.getLogger("soniq_django.scheduler")

# What enqueue raises when the database failed rather than the row: the tick
# stays due and the scheduler tries it again on a new connection.
_DATABASE_FAILURES = (ErrorCode.QUEUE_PERSISTENCE_FAILED, ErrorCode.QUEUE_DATABASE_REFUSED)

MAX_BACKOFF_SECONDS = 30.0


def tick_dedup_key(job_name: str, tick: dt.datetime) -> str:
    """The dedup key of one tick of one schedule: ``sched:<job_name>:<UTC ISO time>``."""
    stamp = tick.astimezone(dt.UTC).isoformat()
    key = f"sched:{job_name}:{stamp}"
    if len(key) > MAX_LABEL_LENGTH:  # dedup keys are bounded; very long names are hashed
        key = f"sched:{hashlib.sha256(job_name.encode()).hexdigest()}:{stamp}"
    return key


def _pause(interval: float, failures: int) -> float:
    """Seconds to wait before the next tick: ``interval``, or a doubling backoff after failures."""
    if not failures:
        return interval
    backoff: float = max(interval, 0.1) * 2 ** min(failures, 10)
    return min(backoff, MAX_BACKOFF_SECONDS)


class Scheduler:
    """Enqueues due recurring jobs in the database ``using`` (default: the router's choice)."""

    def __init__(self, using: str | None = None):
        self.using = using or router.db_for_write(RecurringJob)
        self._reported: set[tuple[Any, ...]] = set()

    def sync_code_schedules(self) -> list[str]:
        """Write the ``@periodic`` schedules of this process to the table; return the job names.

        Code owns schedule type and value, args, queue, priority and
        max_attempts; ``status`` is kept (a paused row stays paused), and
        ``next_run`` is recomputed only when the timing changed. Rows of job
        names without a code schedule are never touched.
        """
        schedules = code_schedules()
        with transaction.atomic(using=self.using):
            self._lock_for_write()
            for schedule in schedules.values():
                self._sync_one(schedule, timezone.now())
        return sorted(schedules)

    def run_due(self, now: dt.datetime | None = None) -> list[uuid.UUID]:
        """Enqueue one job for every active row due at ``now``; return the new job ids.

        ``now`` (default: the current time) must be aware. Rows with a NULL
        ``next_run`` get one first (see ``Timing.first_run``). Raises
        ``ValueError`` for a naive ``now``, and the database's error, with
        nothing enqueued, if the transaction fails.
        """
        now = now or timezone.now()
        if timezone.is_naive(now):
            raise ValueError("run_due(now=...) needs an aware datetime")
        enqueued = []
        with transaction.atomic(using=self.using):
            self._lock_for_write()
            for row in self._due_rows(now):
                job_id = self._fire(row, now)
                if job_id is not None:
                    enqueued.append(job_id)
        return enqueued

    def run_forever(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Sync code schedules, then run due rows every ``interval`` seconds until ``stop`` is set.

        The table is read on every tick, so rows inserted by hand are picked
        up without a restart. Errors (a database restart, say) are logged and
        retried with backoff on a fresh connection; this never raises. Closes this
        thread's connection to the database when it returns.
        """
        logger.info("scheduler started on database %r", self.using)
        synced, failures = False, 0
        try:
            while not stop.is_set():
                try:
                    if not synced:
                        names = self.sync_code_schedules()
                        synced = True
                        logger.info("code schedules written: %s", ", ".join(names) or "none")
                    self.run_due()
                    failures = 0
                except Exception as error:  # a scheduler thread must outlive any one tick
                    failures += 1
                    self._report(error)
                stop.wait(_pause(interval, failures))
        finally:
            connections[self.using].close()
            logger.info("scheduler stopped")

    def _report(self, error: Exception) -> None:
        if isinstance(error, DatabaseError):
            logger.warning("database error (%s); will retry on a new connection",
                           type(error).__name__)
        elif isinstance(error, SoniqError) and error.code in _DATABASE_FAILURES:
            logger.warning("database error (%s: %s); will retry on a new connection",
                           error.code.value, error.reason)
        else:
            logger.exception("scheduler tick failed; will retry")
        # A broken connection must not be reused: the next query reconnects.
        connections[self.using].close()

    # -- one transaction's steps --------------------------------------------

    def _lock_for_write(self) -> None:
        # SQLite has no row locks. A write statement, even one touching no
        # rows, takes the database's write lock now, so two schedulers
        # serialize here instead of both reading the same due row.
        if connections[self.using].vendor == "sqlite":
            with connections[self.using].cursor() as cursor:
                cursor.execute("UPDATE soniq_recurring_jobs SET status = status WHERE 0")

    def _due_rows(self, now: dt.datetime) -> list[RecurringJob]:
        rows = RecurringJob.objects.using(self.using).filter(
            Q(next_run__isnull=True) | Q(next_run__lte=now), status=ScheduleStatus.ACTIVE
        ).order_by("next_run", "job_name")
        if connections[self.using].features.has_select_for_update_skip_locked:
            # Rows another scheduler holds are its to fire; the values read
            # here are the latest committed ones, re-checked under the lock.
            rows = rows.select_for_update(skip_locked=True)
        return list(rows)

    def _fire(self, row: RecurringJob, now: dt.datetime) -> uuid.UUID | None:
        timing = self._timing(row)
        if timing is None:
            return None
        if row.next_run is None:
            row.next_run = timing.first_run(now, row.last_run)
            if row.next_run > now:
                self._save(row, next_run=row.next_run)
                return None
        tick = row.next_run
        following = timing.next_after(tick, now)
        job_id = self._enqueue(row, tick)
        if job_id is None:
            self._save(row, next_run=following)
            return None
        self._save(row, next_run=following, last_run=now, last_job_id=job_id,
                   run_count=F("run_count") + 1)
        logger.info("enqueued %s for %s as job %s; next at %s",
                    row.job_name, tick.isoformat(), job_id, following.isoformat())
        return job_id

    def _enqueue(self, row: RecurringJob, tick: dt.datetime) -> uuid.UUID | None:
        # The dedup key names the tick, so even a caller that retried this
        # transaction by hand could not queue the same tick twice.
        try:
            return enqueue(row.job_name, row.job_kwargs, queue=row.queue, priority=row.priority,
                           max_attempts=row.max_attempts,
                           dedup_key=tick_dedup_key(row.job_name, tick), using=self.using)
        except SoniqError as error:
            if error.code in _DATABASE_FAILURES:  # the tick is tried again, not skipped
                raise
            logger.error("skipped %s at %s: the row cannot be enqueued (%s)",
                         row.job_name, tick.isoformat(), error.reason)
            return None

    def _timing(self, row: RecurringJob) -> Timing | None:
        try:
            return Timing.parse(row.schedule_type, row.schedule_value)
        except ValueError as error:
            key = (row.id, row.schedule_type, row.schedule_value)
            if key not in self._reported:  # once per bad value, not once per tick
                self._reported.add(key)
                logger.error("ignoring schedule %s: %s", row.job_name, error)
            return None

    def _save(self, row: RecurringJob, **values: Any) -> None:
        RecurringJob.objects.using(self.using).filter(pk=row.pk).update(**values)

    def _sync_one(self, schedule: PeriodicSchedule, now: dt.datetime) -> None:
        values = schedule.row_values()
        rows = RecurringJob.objects.using(self.using).select_for_update()
        row = rows.filter(job_name=schedule.job_name).first()
        if row is None:
            try:
                with transaction.atomic(using=self.using):
                    RecurringJob.objects.using(self.using).create(
                        job_name=schedule.job_name, next_run=schedule.timing.first_run(now),
                        **values)
                return
            except IntegrityError:  # another scheduler inserted it first
                row = rows.get(job_name=schedule.job_name)
        retimed = (row.schedule_type, row.schedule_value) != (
            values["schedule_type"], values["schedule_value"])
        if retimed:
            values["next_run"] = schedule.timing.first_run(now, row.last_run)
        if retimed or any(getattr(row, name) != value for name, value in values.items()):
            self._save(row, **values)
