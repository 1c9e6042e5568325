"""Dead-letter replay: put failed jobs back in the queue for another try.

A replay inserts the dead letter's job into ``soniq_jobs`` as ``queued`` --
same id, same job name, queue, priority and args (passed through unchanged,
even old stringified datetimes), ``attempts`` 0 and the dead letter's
``max_attempts`` as a fresh budget, due now -- and, in the same transaction,
adds one to the dead letter's ``resurrection_count`` and stamps
``last_resurrection_at``. The dead-letter row stays: it carries the count,
and when the job fails again the worker's move updates that row and keeps
it.

Each job is replayed in its own transaction (atomic per job, not per call):
a failure half-way leaves the jobs before it replayed and the rest
untouched. Called inside the caller's ``transaction.atomic`` block, each job
becomes a savepoint and everything commits (or not) with the caller.

The job row is copied by an ``INSERT ... SELECT`` inside the database, so
``args`` pass through byte for byte (jsonb on PostgreSQL, JSON text on
SQLite), never re-encoded by Python.

A dead letter is skipped, and reported, when:

- its job id is already in ``soniq_jobs`` (replayed and not finished, or
  re-enqueued by someone else) -- never two rows for one job;
- it was replayed and has not failed since (``last_resurrection_at`` is not
  before ``moved_to_dead_letter_at``): the replayed run may have succeeded
  and expired, and replaying again would run a finished job a second time.
  This makes ``replay --all`` safe to repeat.

Owned submissions keep their identity: the new row carries
``fence_required``, ``submission_id`` and ``submission_fingerprint`` from
the dead letter, so an exact ``submit_owned`` replay still returns the same
job id and housekeeping still never deletes it. Its claim generation starts
at ``resurrection_count * 2**32`` (after the increment), above any
generation an earlier incarnation of the job can have reached (each adds at
most one per attempt, and attempts are 32-bit), so no fence from before the
replay can ever match the new incarnation, even if a worker reused a nonce.

A keyed job's dead letter keeps its key (``concurrency_key``, given by a
trigger when the job's row goes, sql/key_park_v1.sql): the replay inserts it
parked and puts it under its key (``producer.keyed.park``), so the key's
limits (its ``soniq_key_slots`` row, the operators' ``soniq_key_limits``)
hold for it again.

Not carried over (the dead-letter table has no column for them):
``unique_job``/``args_hash``, ``dedup_key``, ``producer_id``, ``active_key``
and the original ``scheduled_at``. ``created_at`` is the dead letter's
``original_created_at``, so the job keeps its enqueue time (the next move to
the dead letters copies it back).

On PostgreSQL the dead-letter row is locked (``FOR UPDATE``) before the
checks, so two replays at once cannot both insert the job; the time is read
with ``clock_timestamp()`` after that lock. Only an INSERT into
``soniq_jobs`` and an UPDATE of ``soniq_dead_letter_jobs`` are written, and
neither is subject to the owned-row protection trigger (it guards UPDATE
and DELETE of ``soniq_jobs``). On SQLite each job holds the write lock.
"""

import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.db.models import Exists, F, OuterRef, Q
from django.utils import timezone

from .models import DeadLetterJob, DeadLetterReason, Job, JobStatus
from .owned._store import guarded, take_sqlite_write_lock

# Generations of one incarnation fit below this; each replay starts above it.
GENERATION_STRIDE = 2**32
_PAGE = 500

REPLAYED = "replayed"
LIVE = "live"
ALREADY_REPLAYED = "already_replayed"
MISSING = "missing"
CONFLICT = "conflict"


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did (or, with ``dry_run``, would do), by job id.

    ``replayed``: back in ``soniq_jobs`` as queued. ``live``: skipped, the
    id is already in ``soniq_jobs``. ``already_replayed``: skipped, replayed
    and not failed since. ``missing``: an id asked for has no dead letter.
    ``conflicts``: the insert was refused by a constraint (for example the
    submission id is held by another live row); nothing was written for it.
    """

    dry_run: bool
    replayed: tuple[uuid.UUID, ...] = ()
    live: tuple[uuid.UUID, ...] = ()
    already_replayed: tuple[uuid.UUID, ...] = ()
    missing: tuple[uuid.UUID, ...] = ()
    conflicts: tuple[uuid.UUID, ...] = ()

    @property
    def skipped(self) -> int:
        """How many dead letters were looked at and left alone."""
        return len(self.live) + len(self.already_replayed) + len(self.conflicts)


@dataclass
class _Tally:
    outcomes: dict[str, list[uuid.UUID]] = field(
        default_factory=lambda: {k: [] for k in (REPLAYED, LIVE, ALREADY_REPLAYED, MISSING,
                                                 CONFLICT)}
    )

    def report(self, dry_run: bool) -> ReplayReport:
        o = self.outcomes
        return ReplayReport(
            dry_run=dry_run, replayed=tuple(o[REPLAYED]), live=tuple(o[LIVE]),
            already_replayed=tuple(o[ALREADY_REPLAYED]), missing=tuple(o[MISSING]),
            conflicts=tuple(o[CONFLICT]),
        )


def replay_dead_letters(using: str = DEFAULT_DB_ALIAS, *, ids: Iterable[Any] | None = None,
                        reason: str | None = None, all: bool = False,  # noqa: A002
                        dry_run: bool = False, now: dt.datetime | None = None,
                        progress: Callable[[int], None] | None = None) -> ReplayReport:
    """Re-queue dead-lettered jobs chosen by ``ids``, by ``reason``, or ``all``.

    Exactly one selector must be given. ``dry_run`` classifies without
    writing or locking. ``now`` replaces the clock for ``scheduled_at`` and
    ``last_resurrection_at``. ``progress`` (optional) is called with the
    number of dead letters handled so far, every 100 and at the end.
    Returns a ReplayReport. Raises ValueError for a
    missing or doubled selector, an id that is not a UUID, a reason that is
    no dead-letter reason (``DeadLetterReason``, or one a dead letter on this
    database has: another worker's) -- the message lists the valid ones -- or
    a naive ``now``; SoniqError(QUEUE_PERSISTENCE_FAILED) when the database
    fails (jobs already replayed stay replayed).
    """
    selected = _selection(ids, reason, all)
    if reason is not None:
        _check_reason(using, reason)
    if now is not None and (not isinstance(now, dt.datetime) or timezone.is_naive(now)):
        raise ValueError("now must be an aware datetime")
    tally = _Tally()
    if isinstance(selected, list):
        found = set(_existing(using, selected))
        tally.outcomes[MISSING].extend(i for i in selected if i not in found)
        candidates: Iterable[uuid.UUID] = [i for i in selected if i in found]
    else:
        candidates = _pages(using, selected)
    handled = 0
    for job_id in candidates:
        outcome = _classify(using, job_id) if dry_run else _replay_one(using, job_id, now)
        tally.outcomes[outcome].append(job_id)
        handled += 1
        if progress is not None and handled % 100 == 0:
            progress(handled)
    if progress is not None and handled % 100:
        progress(handled)
    return tally.report(dry_run)


def _selection(ids: Any, reason: Any, all_: Any) -> list[uuid.UUID] | Q:
    """The chosen ids (deduplicated, in order) or a filter; ValueError unless exactly one."""
    given = (ids is not None) + (reason is not None) + (all_ is True)
    if given != 1 or all_ not in (True, False):
        raise ValueError("give exactly one of ids, reason or all=True")
    if reason is not None:
        if type(reason) is not str or not reason:
            raise ValueError("reason must be a non-empty string")
        return Q(dead_letter_reason=reason)
    if all_:
        return Q()
    if isinstance(ids, (str, uuid.UUID)):
        raise ValueError("ids must be a list of job ids")
    chosen = list(dict.fromkeys(_as_uuid(i) for i in ids))
    if not chosen:
        raise ValueError("ids must name at least one job")
    return chosen


def dead_letter_reasons(using: str = DEFAULT_DB_ALIAS) -> list[str]:
    """Every reason a replay can select by: soniq's own, and any other a dead letter holds."""
    with guarded(using, atomic=False):
        stored = set(DeadLetterJob.objects.using(using).order_by()
                     .values_list("dead_letter_reason", flat=True).distinct())
    return sorted(set(DeadLetterReason.values) | stored)


def _check_reason(using: str, reason: str) -> None:
    # soniq's own reasons need no look-up; another is valid only if some
    # dead letter carries it (written by another release or language).
    if reason in DeadLetterReason.values:
        return
    known = dead_letter_reasons(using)
    if reason not in known:
        raise ValueError(f"reason must be one of the dead-letter reasons: {', '.join(known)}")


def _as_uuid(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ValueError("every id must be a UUID") from None


def _existing(using: str, ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Which of ``ids`` have a dead letter."""
    with guarded(using, atomic=False):
        found = []
        for start in range(0, len(ids), _PAGE):
            chunk = ids[start:start + _PAGE]
            found += DeadLetterJob.objects.using(using).filter(id__in=chunk).values_list(
                "id", flat=True)
        return found


def _pages(using: str, where: Q) -> Iterator[uuid.UUID]:
    """Matching dead-letter ids in id order, a page at a time.

    Walking by id means each dead letter is visited once, even if a replayed
    job fails again (and its row is rewritten) while the walk goes on.
    """
    last = None
    while True:
        page = DeadLetterJob.objects.using(using).filter(where)
        if last is not None:
            page = page.filter(id__gt=last)
        with guarded(using, atomic=False):
            chunk = list(page.order_by("id").values_list("id", flat=True)[:_PAGE])
        yield from chunk
        if len(chunk) < _PAGE:
            return
        last = chunk[-1]


def still_dead() -> Q:
    """The dead letters that are dead now: never replayed, or failed again since.

    A replayed job's dead-letter row stays (it carries the replay count) while
    the job is back in ``soniq_jobs``: counting it as a dead letter too would
    count the job twice. The rule of ``_already_replayed``, as a filter.
    """
    return (Q(last_resurrection_at__isnull=True)
            | Q(last_resurrection_at__lt=F("moved_to_dead_letter_at")))


def _already_replayed(dead: DeadLetterJob) -> bool:
    """Replayed, and not back in the dead letters since (``still_dead`` is its negation)."""
    return (
        dead.last_resurrection_at is not None
        and dead.last_resurrection_at >= dead.moved_to_dead_letter_at
    )


def _classify(using: str, job_id: uuid.UUID) -> str:
    """What a replay would do with this dead letter, reading only."""
    with guarded(using, atomic=False):
        live = Job.objects.using(using).filter(id=OuterRef("id"))
        dead = (
            DeadLetterJob.objects.using(using).filter(id=job_id)
            .annotate(is_live=Exists(live)).first()
        )
    if dead is None:
        return MISSING
    if dead.is_live:
        return LIVE
    return ALREADY_REPLAYED if _already_replayed(dead) else REPLAYED


def _replay_one(using: str, job_id: uuid.UUID, now: dt.datetime | None) -> str:
    """Replay one dead letter in its own transaction; returns the outcome."""
    with guarded(using, atomic=True) as connection:
        if connection.vendor == "sqlite":
            take_sqlite_write_lock(connection)
        # Locked first (PostgreSQL): a second replay of this job waits here
        # and, once we commit, finds the job live.
        dead = DeadLetterJob.objects.using(using).select_for_update().filter(id=job_id).first()
        if dead is None:
            return MISSING
        if Job.objects.using(using).filter(id=job_id).exists():
            return LIVE
        if _already_replayed(dead):
            return ALREADY_REPLAYED
        moment = now or _clock(connection)
        count = dead.resurrection_count + 1
        try:
            with transaction.atomic(using=using):
                _insert_requeued(connection, job_id, count, moment,
                                 keyed=dead.concurrency_key is not None)
        except IntegrityError:
            return CONFLICT
        if dead.concurrency_key is not None:
            from .producer.keyed import park  # limits per key: under its key again

            park(job_id, moment, using, connection)
        DeadLetterJob.objects.using(using).filter(id=job_id).update(
            resurrection_count=F("resurrection_count") + 1, last_resurrection_at=moment
        )
        _notify(connection, dead.queue)
    return REPLAYED


# Copy the dead letter into soniq_jobs inside the database, so args (jsonb
# on PostgreSQL, JSON text on SQLite) pass through byte for byte rather than
# through a Python round trip that could change a number's spelling.
_REQUEUE = """
INSERT INTO {jobs} (
    id, job_name, args, args_hash, status, attempts, max_attempts, queue, priority,
    unique_job, dedup_key, scheduled_at, expires_at, last_error, result, producer_id,
    worker_id, created_at, updated_at, claim_generation, claim_token, claim_owner,
    lease_expires_at, fence_required, cancel_requested, pid, active_key, submission_id,
    submission_fingerprint, concurrency_key)
SELECT d.id, d.job_name, d.args, NULL, %s, 0, d.max_attempts, d.queue, d.priority,
       %s, NULL, %s, NULL, d.last_error, NULL, NULL,
       NULL, COALESCE(d.original_created_at, %s), %s, %s, NULL, NULL,
       NULL, d.fence_required, %s, NULL, NULL, d.submission_id,
       d.submission_fingerprint, d.concurrency_key
  FROM {dead} AS d
 WHERE d.id = %s
"""


def _insert_requeued(connection: Any, job_id: uuid.UUID, count: int, moment: dt.datetime,
                     keyed: bool = False) -> None:
    """Insert the dead letter's job into ``soniq_jobs`` as queued; IntegrityError on a clash.

    ``keyed``: the dead letter has a key; the row goes in parked (``KEY_PARKED_AT``)
    and the caller parks it under its key."""
    from .keys.models import KEY_PARKED_AT

    ops = connection.ops
    sql = _REQUEUE.format(
        jobs=ops.quote_name(Job._meta.db_table), dead=ops.quote_name(DeadLetterJob._meta.db_table)
    )
    field = Job._meta.get_field("updated_at")
    when = field.get_db_prep_value(moment, connection)
    due = field.get_db_prep_value(KEY_PARKED_AT, connection) if keyed else when
    pk = Job._meta.pk.get_db_prep_value(job_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(sql, [
            JobStatus.QUEUED.value, False,  # type: ignore[attr-defined]  # TextChoices
            due, when, when, count * GENERATION_STRIDE, False, pk,
        ])


def _clock(connection: Any) -> dt.datetime:
    """The time now, read after the lock: the database clock on PostgreSQL."""
    now: dt.datetime
    if connection.vendor != "postgresql":
        now = timezone.now()
        return now
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        now = cursor.fetchone()[0]
        return now


def _notify(connection: Any, queue: str) -> None:
    """Wake idle PostgreSQL workers at commit, as an enqueue does."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify('soniq_new_job', %s)", [queue])
