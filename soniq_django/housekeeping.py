"""Housekeeping: delete finished jobs whose result expired, and old dead letters.

A finished row (``done`` or ``cancelled``) carries ``expires_at`` --
finish time plus ``RESULT_TTL`` -- and may be deleted once that has passed.
``purge_expired`` does so in short batches, each its own transaction, so it
never holds many locks and a crash loses at most one batch of work.

Protected rows are never deleted: a row with ``fence_required`` or a
``submission_id`` belongs to an owned submission, whose identity must keep
answering replays until the reviewed retirement command removes it. The
filter is part of every query. On PostgreSQL the protection trigger would
also skip such a DELETE, but then the reported count would be wrong and a
changed trigger would silently start deleting them, so we do not lean on it.

Time: on PostgreSQL the database clock decides (``now()`` in SQL); on SQLite
there is no server, and Python's ``timezone.now()`` is the same clock the
owned operations use to write ``expires_at`` there.
"""

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from .errors import translating
from .models import DeadLetterJob, Job, JobStatus
from .owned._store import bounds_sql, guarded, take_sqlite_write_lock

FINISHED = (JobStatus.DONE, JobStatus.CANCELLED)

# Owned submissions keep their identity forever (until reviewed retirement).
UNPROTECTED = Q(fence_required=False) & Q(submission_id__isnull=True)

# One batch on PostgreSQL: lock up to %s purgeable rows, skipping rows other
# transactions hold (a concurrent purge, a worker), and delete them in the
# same statement. A MATERIALIZED CTE, not "id IN (SELECT ... LIMIT)": the
# planner may re-run such a subquery per outer row, locking and deleting far
# more than the LIMIT. The DELETE repeats the protection on purpose.
_PG_PURGE = """
WITH batch AS MATERIALIZED (
    SELECT id FROM {table}
     WHERE expires_at <= {now} AND expires_at > %s
       AND status IN ('done', 'cancelled')
       AND NOT fence_required AND submission_id IS NULL
     LIMIT %s
       FOR UPDATE SKIP LOCKED)
DELETE FROM {table} AS j
 USING batch
 WHERE j.id = batch.id
   AND j.status IN ('done', 'cancelled')
   AND NOT j.fence_required AND j.submission_id IS NULL
"""


def _check_batch(batch: int) -> int:
    if type(batch) is not int or batch < 1:
        raise ValueError("batch must be a positive integer")
    return batch


def _check_now(now: dt.datetime | None, name: str = "now") -> dt.datetime | None:
    if now is not None and (not isinstance(now, dt.datetime) or timezone.is_naive(now)):
        raise ValueError(f"{name} must be an aware datetime")
    return now


def purge_expired(using: str = DEFAULT_DB_ALIAS, *, batch: int = 1000,
                  now: dt.datetime | None = None,
                  progress: Callable[[int], None] | None = None,
                  batches: int | None = None,
                  after: dt.datetime | None = None) -> int:
    """Delete finished, unprotected jobs whose ``expires_at`` has passed.

    Works in transactions of at most ``batch`` rows until a batch comes back
    short, or ``batches`` batches were made (None: no limit); ``progress`` (if given) is called with the running total after
    every batch that deleted something. ``now`` replaces the database clock
    (for tests and for "purge as of"). ``after`` (if given) leaves the rows
    that expired at or before it: the worker's own purge reads only what
    expired since its last complete one, since under an old snapshot the
    rows it deleted stay in the ``expires_at`` index, and a purge from the
    start would read them all again, batch after batch. Returns how many
    rows were deleted.
    Raises ValueError for a bad ``batch``, ``batches`` or ``now``, and
    SoniqError(QUEUE_PERSISTENCE_FAILED) when the database fails (batches
    already committed stay deleted).
    """
    _check_batch(batch)
    if batches is not None and (type(batches) is not int or batches < 1):
        raise ValueError("batches must be a positive integer or None")
    _check_now(now)
    _check_now(after, "after")
    purge_batch = _pg_batch if connections[using].vendor == "postgresql" else _sqlite_batch
    total = made = 0
    while True:
        deleted = purge_batch(using, batch, now, after)
        total, made = total + deleted, made + 1
        if deleted and progress is not None:
            progress(total)
        if deleted < batch or made == batches:
            return total


def _pg_batch(using: str, batch: int, now: dt.datetime | None,
              after: dt.datetime | None = None) -> int:
    """One PostgreSQL batch: a single DELETE statement; returns its row count."""
    with guarded(using, atomic=True) as connection, connection.cursor() as cursor:
        sql = _PG_PURGE.format(
            table=connection.ops.quote_name(Job._meta.db_table),
            now="now()" if now is None else "%s",
        )
        bound = "-infinity" if after is None else after
        cursor.execute(sql, [bound, batch] if now is None else [now, bound, batch])
        deleted: int = cursor.rowcount
        return deleted


def _sqlite_batch(using: str, batch: int, now: dt.datetime | None,
                  after: dt.datetime | None = None) -> int:
    """One SQLite batch inside the write lock; returns how many rows it deleted."""
    with guarded(using, atomic=True) as connection:
        take_sqlite_write_lock(connection)
        expired = Job.objects.using(using).filter(
            UNPROTECTED, status__in=FINISHED, expires_at__lte=now or timezone.now()
        )
        if after is not None:
            expired = expired.filter(expires_at__gt=after)
        ids = list(expired.values_list("id", flat=True)[:batch])
        if not ids:
            return 0
        deleted: int
        deleted, _ = expired.filter(id__in=ids).delete()
        return deleted


def purge_dead_letters(using: str = DEFAULT_DB_ALIAS, *, older_than: dt.timedelta,
                       dry_run: bool = False, batch: int = 1000,
                       now: dt.datetime | None = None) -> int:
    """Delete dead letters that landed more than ``older_than`` ago.

    Never deletes a dead letter with an owned submission identity, nor one
    whose job is back in ``soniq_jobs`` after a replay (its row carries the
    resurrection count the next failure keeps). With ``dry_run`` nothing is
    deleted. Returns how many rows were (or would be) deleted. Raises
    ValueError for a negative ``older_than``, a bad ``batch`` or ``now``,
    and SoniqError(QUEUE_PERSISTENCE_FAILED) when the database fails.
    """
    if not isinstance(older_than, dt.timedelta) or older_than < dt.timedelta(0):
        raise ValueError("older_than must be a non-negative timedelta")
    _check_batch(batch)
    cutoff = (_check_now(now) or database_now(using)) - older_than
    if dry_run:
        with guarded(using, atomic=False):
            count: int = _old_dead_letters(using, cutoff).count()
            return count
    total = 0
    while True:
        deleted = _dead_letter_batch(using, cutoff, batch)
        total += deleted
        if deleted < batch:
            return total


def _old_dead_letters(using: str, cutoff: dt.datetime) -> Any:
    """Unprotected dead letters moved before ``cutoff`` whose job is not live."""
    live = Job.objects.using(using).filter(id=OuterRef("id"))
    return DeadLetterJob.objects.using(using).filter(
        UNPROTECTED, ~Exists(live), moved_to_dead_letter_at__lt=cutoff
    )


def _dead_letter_batch(using: str, cutoff: dt.datetime, batch: int) -> int:
    """Delete one batch of old dead letters; returns how many went."""
    with guarded(using, atomic=True) as connection:
        if connection.vendor == "sqlite":
            take_sqlite_write_lock(connection)
        old = _old_dead_letters(using, cutoff)
        # SKIP LOCKED: a dead letter a replay holds is left for next time.
        ids: list[uuid.UUID] = list(
            old.select_for_update(skip_locked=True).values_list("id", flat=True)[:batch]
        )
        if not ids:
            return 0
        deleted: int
        deleted, _ = old.filter(id__in=ids).delete()
        return deleted


def database_now(using: str) -> dt.datetime:
    """The database's current time (PostgreSQL), or Python's on SQLite."""
    connection = connections[using]
    now: dt.datetime
    if connection.vendor != "postgresql":
        now = timezone.now()
        return now
    with guarded(using, atomic=False), connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        now = cursor.fetchone()[0]
        return now


def forget_lapsed_waiters(using: str) -> int:
    """Delete the rows of ``soniq_job_waiters`` whose ``wait_for_job`` died without deleting
    its own, past their expiry (PostgreSQL; the heartbeat's purge turn calls it)."""
    if connections[using].vendor != "postgresql":
        return 0
    with translating(using), connections[using].cursor() as cursor:
        cursor.execute("DELETE FROM soniq_job_waiters WHERE expires_at < pg_catalog.now()")
        return int(cursor.rowcount)


def settle_lapsed(using: str, ttl: float, lock_wait: float | None = None) -> int:
    """Settle up to 100 lapsed leases, read from the start of the lease index; how many
    (PostgreSQL: ``soniq_settle_lapsed``, claim protocol v14; the heartbeat's housekeeping
    calls it once a minute). 0 on SQLite, whose claims read every lapsed lease themselves.

    Under a pinned horizon a claim reads only the leases that ended since its session's
    last probe, and from the start only every 300 s: this is the probe from the start that
    settles, within about a minute, a lease that ended before that bound but committed late
    (decision 0053). Each row waits at most 5 ms for its lock; one held elsewhere is left
    for a later call or claim. With ``lock_wait`` the call is bounded as every call on the
    worker's shared connection is (``bounds_sql``: its statement at most twice that), so
    that under a very long pin its read of the lease index cannot hold the heartbeat's
    turn unbounded; past it, it raises and nothing was settled.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return 0
    with translating(using), transaction.atomic(using=using), connection.cursor() as cursor:
        if lock_wait is not None:
            cursor.execute(bounds_sql(lock_wait))
        cursor.execute("SELECT soniq_settle_lapsed(%s)", [ttl])
        settled: int = cursor.fetchone()[0]
        return settled
