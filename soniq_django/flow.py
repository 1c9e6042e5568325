"""Flow control per queue: pause and resume; at most N running, at most N started per period.

Claims obey one thing: the table ``soniq_queue_settings`` (``QueueSetting``),
read inside every claim -- by the SQL functions any worker calls
(sql/claim_protocol_v5.sql) and by their SQLite twin (owned/_store.py). Two
kinds of values live in a row:

- what ``SONIQ["QUEUES"]`` says, in the ``configured_*`` columns. Django's
  settings are not visible to SQL, so ``sync_configured`` writes them there:
  every soniq_django worker does when it starts, and so does
  ``manage.py soniq_queue sync``;
- an operator's: ``paused`` (``pause_queue``, ``resume_queue``, the admin)
  and the overrides ``concurrency``, ``rate_limit``/``rate_period`` (the
  admin, or SQL). An override wins; NULL falls back to the configured
  value, field by field.

docs/operations.md is the guide; docs/decisions/0016-queue-flow-control.md
says why it is built this way.
"""

import re
from dataclasses import dataclass
from typing import Any

from django.core import checks
from django.db import IntegrityError, connections, transaction
from django.db.models import Count, Q
from django.utils import timezone

from .conf import get_settings
from .encoding import encodable
from .errors import ConfigValidationError, ErrorCode, SettingsInvalid, translating

#: A rate's unit: its window in seconds.
RATE_UNITS = {"s": 1, "m": 60, "h": 3600}
_RATE = re.compile(r"\s*(\d+)\s*/\s*([smh])\s*")
_KEYS = ("concurrency", "rate")
#: The largest concurrency or rate count (the columns are 32-bit integers).
MAX_LIMIT = 2**31 - 1
MAX_QUEUE_NAME = 255
#: The shortest pause between claims of a worker held back by a rate limit.
MIN_RATE_POLL = 0.05


@dataclass(frozen=True)
class Limits:
    """A queue's limits: jobs running at once, and starts per ``rate_period`` seconds."""

    concurrency: int | None = None
    rate_limit: int | None = None
    rate_period: int | None = None


def parse_rate(value: Any) -> tuple[int, int]:
    """``"10/s"`` -> ``(10, 1)``: at most 10 starts in any window of 1 second.

    The unit is ``s``, ``m`` or ``h``; the count a whole number from 1.
    Raises ``ValueError`` for anything else.
    """
    match = _RATE.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ValueError("a rate is a string 'N/s', 'N/m' or 'N/h'")
    count = int(match[1])
    if not 1 <= count <= MAX_LIMIT:
        raise ValueError(f"a rate's count must be from 1 to {MAX_LIMIT}")
    return count, RATE_UNITS[match[2]]


def _queue_problems(name: Any, entry: Any) -> list[str]:
    where = f"SONIQ['QUEUES'][{name!r}]"
    if (type(name) is not str or not name or len(name) > MAX_QUEUE_NAME or "\x00" in name
            or not encodable(name)):
        return [f"SONIQ['QUEUES'] keys must be queue names (1-{MAX_QUEUE_NAME} characters of "
                "valid Unicode)."]
    if not isinstance(entry, dict):
        return [f"{where} must be a dict such as {{'concurrency': 5, 'rate': '10/s'}}."]
    found = []
    unknown = sorted(map(str, set(entry) - set(_KEYS)))
    if unknown:
        found.append(f"{where} has unknown key(s): {', '.join(unknown)} "
                     f"(known: {', '.join(_KEYS)}).")
    concurrency = entry.get("concurrency")
    if concurrency is not None and not (type(concurrency) is int
                                        and 1 <= concurrency <= MAX_LIMIT):
        found.append(f"{where}['concurrency'] must be None or a whole number from 1.")
    rate = entry.get("rate")
    if rate is not None:
        try:
            parse_rate(rate)
        except ValueError as error:
            found.append(f"{where}['rate'] is not a rate: {error}.")
    return found


def problems(value: Any) -> list[str]:
    """What is wrong with a ``SONIQ["QUEUES"]`` value, one sentence each (empty: nothing)."""
    if not isinstance(value, dict):
        return ["SONIQ['QUEUES'] must be a dict: queue name -> "
                "{'concurrency': N, 'rate': 'N/s' | 'N/m' | 'N/h'}."]
    return [problem for name, entry in value.items() for problem in _queue_problems(name, entry)]


def settings_messages(value: Any) -> list[checks.CheckMessage]:
    """soniq.E011 for each problem of ``SONIQ["QUEUES"]``."""
    return [checks.Error(problem, hint="For example SONIQ['QUEUES'] = {'emails': "
                                       "{'concurrency': 5, 'rate': '10/s'}}; see "
                                       "docs/settings.md.", id="soniq.E011")
            for problem in problems(value)]


def configured_limits() -> dict[str, Limits]:
    """``SONIQ["QUEUES"]`` as ``Limits`` per queue.

    Raises ``SettingsInvalid`` (SETTINGS_INVALID, check soniq.E011) when the
    value is invalid: a worker must not start on limits it cannot apply.
    """
    value = get_settings().QUEUES
    if problems(value):
        raise SettingsInvalid("QUEUES", "soniq.E011",
                              f"SONIQ['QUEUES'] is not a valid flow-control setting (got a "
                              f"value of type {type(value).__name__}); manage.py check reports "
                              "it as soniq.E011")
    found = {}
    for name, entry in value.items():
        rate = entry.get("rate")
        count, period = parse_rate(rate) if rate is not None else (None, None)
        found[name] = Limits(entry.get("concurrency"), count, period)
    return found


def _models() -> Any:
    from .models import QueueSetting

    return QueueSetting


def _alias(using: str | None) -> str:
    from .producer.api import write_alias

    return write_alias(using)


def queue_name(value: Any) -> str:
    """``value`` if it can name a queue; else ConfigValidationError (INVALID_OPTION) saying why.

    1 to ``MAX_QUEUE_NAME`` characters of valid Unicode, without a NUL: what
    ``pause_queue`` and the claims accept (the admin's queue form checks it too).
    """
    if type(value) is not str or not value or len(value) > MAX_QUEUE_NAME or "\x00" in value:
        raise ConfigValidationError(
            f"queue must be a non-empty string of at most {MAX_QUEUE_NAME} characters",
            code=ErrorCode.INVALID_OPTION)
    if not encodable(value):
        raise ConfigValidationError("queue holds a lone surrogate, which is not valid Unicode",
                                    code=ErrorCode.INVALID_OPTION)
    return value


_name = queue_name


def _by(value: Any) -> str | None:
    """``pause_queue``'s ``by``: None, or text the database can store (INVALID_OPTION)."""
    if value is None:
        return None
    if type(value) is not str or "\x00" in value or not encodable(value):
        raise ConfigValidationError("by must be None or a string without a NUL character or a "
                                    "lone surrogate", code=ErrorCode.INVALID_OPTION)
    return value


def _configured(row: Any) -> Limits:
    return Limits(row.configured_concurrency, row.configured_rate_limit,
                  row.configured_rate_period)


def sync_configured(using: str | None = None) -> list[str]:
    """Write ``SONIQ["QUEUES"]`` into the ``configured_*`` columns; return the queues changed.

    A queue the setting names gets its row (created if missing); a row
    whose configured values the setting no longer names has them cleared.
    Overrides and ``paused`` are never touched. Rows are written one by one
    in queue-name order -- the order in which claims lock them -- so a
    sync never deadlocks with a claim. Raises ``SettingsInvalid`` when the
    setting is invalid (soniq.E011), database errors as ``SoniqError``
    (``errors.translate``).
    """
    QueueSetting = _models()
    alias = _alias(using)
    wanted = configured_limits()
    with translating(alias):
        rows = {row.queue: row for row in QueueSetting.objects.using(alias).filter(
            Q(queue__in=list(wanted)) | Q(configured_concurrency__isnull=False)
            | Q(configured_rate_limit__isnull=False))}
        stale = sorted(name for name in set(wanted) | set(rows)
                       if (_configured(rows[name]) if name in rows else Limits())
                       != wanted.get(name, Limits()))
        for name in stale:
            _write_configured(alias, name, wanted.get(name, Limits()))
    return stale


def _write_configured(alias: str, name: str, limits: Limits) -> None:
    QueueSetting = _models()
    values = {"configured_concurrency": limits.concurrency,
              "configured_rate_limit": limits.rate_limit,
              "configured_rate_period": limits.rate_period, "updated_at": timezone.now()}
    for attempt in range(2):
        try:
            with transaction.atomic(using=alias):
                if QueueSetting.objects.using(alias).filter(queue=name).update(**values):
                    return
                if limits == Limits():
                    return  # nothing to clear: the row is gone
                QueueSetting.objects.using(alias).create(queue=name, **values)
                return
        except IntegrityError:
            if attempt:  # created by another worker in between: update it instead
                raise


def pause_queue(name: str, *, by: str | None = None, using: str | None = None,
                create: bool = True) -> bool:
    """Stop every worker from claiming the queue's jobs; True if it was not paused before.

    Takes effect for every claim that starts after it returns, on every
    worker (any language: the claim functions read the row). Running jobs
    finish as usual; their retries wait in the queue. ``by`` is recorded in
    ``paused_by`` (who, for people to read). A queue without a settings row
    gets one; with ``create=False`` it does not, and nothing changes (False).
    """
    QueueSetting = _models()
    queue, by, alias = _name(name), _by(by), _alias(using)
    now = timezone.now()
    with translating(alias):
        for attempt in range(2):
            try:
                with transaction.atomic(using=alias):
                    if QueueSetting.objects.using(alias).filter(queue=queue, paused=False).update(
                            paused=True, paused_at=now, paused_by=by, updated_at=now):
                        return True
                    if not create or QueueSetting.objects.using(alias).filter(
                            queue=queue).exists():
                        return False  # paused already, or no row to pause and none to add
                    QueueSetting.objects.using(alias).create(
                        queue=queue, paused=True, paused_at=now, paused_by=by, updated_at=now)
                    return True
            except IntegrityError:  # another caller created the row in between
                if attempt:
                    raise
    return False  # pragma: no cover - the loop always returns or raises


def resume_queue(name: str, *, using: str | None = None) -> bool:
    """Let workers claim the queue's jobs again; True if it was paused.

    On PostgreSQL the workers serving the queue are woken at once (NOTIFY,
    as an enqueue does); elsewhere they see it at their next poll.
    """
    QueueSetting = _models()
    queue, alias = _name(name), _alias(using)
    now = timezone.now()
    with translating(alias), transaction.atomic(using=alias):
        resumed = bool(QueueSetting.objects.using(alias).filter(queue=queue, paused=True).update(
            paused=False, paused_at=None, paused_by=None, updated_at=now))
        if resumed:
            wake_workers(alias, queue)
    return resumed


def wake_workers(alias: str, queue: str) -> None:
    """On PostgreSQL, wake the idle workers of ``queue`` when the transaction commits."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        from .worker.wakeup import CHANNEL

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, queue])


@dataclass(frozen=True)
class QueueState:
    """One queue as ``soniq_queue status`` shows it: its flow control and its jobs now."""

    queue: str
    paused: bool
    concurrency: int | None
    """The limit claims apply (override, else configured); None: none."""
    rate: tuple[int, int] | None
    """``(starts, per seconds)`` claims apply; None: none."""
    overridden: tuple[str, ...]
    """Which of ``concurrency`` and ``rate`` come from the row's override."""
    running: int
    queued: int
    paused_by: str | None = None
    in_sync: bool = True
    """Whether the row's configured values are this process's ``SONIQ["QUEUES"]``."""


def queue_states(using: str | None = None) -> list[QueueState]:
    """Every queue with a settings row or a ``SONIQ["QUEUES"]`` entry, by name."""
    from .models import Job, JobStatus

    QueueSetting = _models()
    alias = _alias(using)
    try:
        wanted = configured_limits()
    except SettingsInvalid:
        wanted = {}
    with translating(alias):
        rows = {row.queue: row for row in QueueSetting.objects.using(alias).all()}
        names = sorted(set(rows) | set(wanted))
        counts = {(row["queue"], row["status"]): row["n"] for row in Job.objects.using(alias)
                  .filter(queue__in=names, status__in=[JobStatus.QUEUED, JobStatus.PROCESSING])
                  .values("queue", "status").annotate(n=Count("id"))}
    states = []
    for name in names:
        row = rows.get(name) or QueueSetting(queue=name)
        overridden = tuple(field for field, value in (("concurrency", row.concurrency),
                                                      ("rate", row.rate_limit))
                           if value is not None)
        states.append(QueueState(
            queue=name, paused=row.paused, concurrency=row.effective_concurrency,
            rate=row.effective_rate, overridden=overridden,
            running=counts.get((name, JobStatus.PROCESSING), 0),
            queued=counts.get((name, JobStatus.QUEUED), 0), paused_by=row.paused_by,
            in_sync=_configured(row) == wanted.get(name, Limits())))
    return states


def rate_poll(using: str, queues: list[str] | None) -> float | None:
    """How soon a worker of ``queues`` whose claim found nothing should claim again.

    A rate limit of N per P seconds frees a start every P/N seconds on
    average; waiting the full ``POLL_INTERVAL`` would leave it unused. So
    the shortest P/N of the rate-limited, unpaused queues served (at least
    ``MIN_RATE_POLL``), or None when no queue served has a rate limit.
    """
    QueueSetting = _models()
    rows = QueueSetting.objects.using(using).filter(
        Q(rate_limit__isnull=False) | Q(configured_rate_limit__isnull=False), paused=False)
    if queues is not None:
        rows = rows.filter(queue__in=queues)
    found = [period / count for count, period in
             (row.effective_rate for row in rows)]
    return max(MIN_RATE_POLL, min(found)) if found else None
